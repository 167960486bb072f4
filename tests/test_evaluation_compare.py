"""The robustness evaluation compares KGW, Gumbel and SynthID side by side."""

from __future__ import annotations

import hashlib
import json

import pytest

from evaluation.harness import COMPARE_SCHEMES, EvalConfig
from evaluation.runner import RunSetup, run_evaluation


def test_compare_preset_and_lengths_are_checked_at_the_door():
    config = EvalConfig(schemes=("compare",), lengths=(100, 50, 50))
    assert [s.format().split(":")[0] for s in config.specs][-2:] == ["gumbel", "synthid"]
    assert len(config.specs) == len(COMPARE_SCHEMES)
    assert config.lengths == (50, 100)
    with pytest.raises(ValueError, match="lengths"):
        EvalConfig(tokens=100, lengths=(200,))
    with pytest.raises(ValueError, match="exact_fprs"):
        EvalConfig(exact_fprs=(0.0,))
    with pytest.raises(ValueError, match="deltas"):
        EvalConfig(schemes=("gumbel",), deltas=(1.0,))


@pytest.mark.slow
def test_kgw_gumbel_and_synthid_side_by_side(tmp_path):
    from generation.models import load_model
    from watermark.keys import Keyring

    keyring = Keyring(home=tmp_path / "home", master_key=bytes(range(32)))
    keyring.create("cmp", secret=hashlib.sha256(b"compare-key/0").digest())
    config = EvalConfig(n=8, tokens=120, schemes=("lefthash", "gumbel", "synthid"), attacks=("token-delete",),
                        rates=(0.0, 0.25), null_keys=1, lengths=(50, 120), max_num_seqs=32, seed=0)
    results = run_evaluation(config, tmp_path / "out", RunSetup(loaded=load_model(), keyring=keyring, progress=False))
    labels = [s["label"] for s in results["schemes"]]
    assert labels == ["lefthash-h1-g0.25-d2", "gumbel-h4", "synthid-h4-m30"]  # a non-default KGW spec: its null keys too
    for scheme in results["schemes"]:
        clean = next(c for c in scheme["results"] if c["rate"] == 0)
        by = clean["by_length"]
        assert set(by) == {"50", "120"} and set(by["120"]["tpr_exact"]) == {"0.001", "1e-05"}
        # 120 watermarked tokens at temperature 1: every scheme's clean texts carry strong evidence
        assert by["120"]["tpr_exact"]["0.001"] >= 0.75, scheme["label"]
        assert by["50"]["tpr_exact"]["1e-05"] <= by["120"]["tpr_exact"]["1e-05"]  # more tokens, more evidence
        assert 0 < by["120"]["distinct_2"] <= 1 and 0 <= by["120"]["repetition_rate"] < 1
        # the human negatives stay negatives under the same key
        assert scheme["negatives"]["human"]["fraction_at_or_above_4"] <= 0.02
    table = (tmp_path / "out" / "comparison.md").read_text()
    assert all(label in table for label in labels) and "TPR@1e-05 T=120" in table
    for name in ("compare_tpr_0.001.png", "compare_tokens_to_detect.png", "compare_quality.png", "compare_attacks.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000
    assert json.loads((tmp_path / "out" / "results.json").read_text())["config"]["lengths"] == [50, 120]
