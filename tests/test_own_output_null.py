"""evaluation.own_output_null: the replay judges each output against the memory exactly as it stood right
after the service wrote it (its own units counted, the null of the outputs up to it, never a stale copy),
and the summary counts flags against binomial bounds."""

import random

import pytest

from db.output_memory import WARMUP
from detector.spoof_check import MIN_NULL
from evaluation.own_output_null import main, replay, summarise
from watermark.config import WatermarkSpec
from watermark.vocab import load_vocabulary


def test_each_output_is_checked_against_the_memory_as_of_itself():
    vocab = load_vocabulary()
    rng = random.Random(3)
    words = [rng.randrange(200, 20000) for _ in range(400)]  # a small shared vocabulary: units recur
    outputs = [[rng.choice(words) for _ in range(60)] for _ in range(WARMUP + MIN_NULL + 30)]
    checks = replay(outputs, WatermarkSpec.default(), b"s" * 32, vocab, progress=False)
    assert len(checks) == 30 and [c["index"] for c in checks] == list(range(WARMUP + MIN_NULL, len(outputs)))
    assert all(c["null_outputs"] == c["index"] + 1 - WARMUP for c in checks)  # the null grows with each output
    summary = summarise(checks)
    cell = summary["p_value_flagged_at_0.05"]
    assert summary["checked"] == 30 and cell["expected"] == pytest.approx(1.5)
    assert cell["flagged"] == sum(c["p_value"] <= 0.05 for c in checks) and cell["upper_95"] > cell["rate"]


@pytest.mark.parametrize("argv", [["--texts", "10"], ["--spec", "gumbel:h=4"], ["--spec", "kgw:scheme=nope"]])
def test_bad_arguments_are_refused_before_any_work(argv, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not (tmp_path / "out").exists()
