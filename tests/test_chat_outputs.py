"""``python -m evaluation.chat_outputs``: the calibration's outputs of varied chat requests are the same requests on
every machine, written in the form the calibration reads, resumable; bad arguments are a usage error."""

from __future__ import annotations

import pytest
from http_fixtures import shared_vocabulary

from evaluation.chat_outputs import REQUESTS, main, requests
from evaluation.paraphrase_calibration import read_outputs


def test_the_requests_are_a_fixed_varied_sequence():
    tokenizer = shared_vocabulary().tokenizer
    first = requests(tokenizer, 40)
    assert first == requests(tokenizer, 40)
    assert first[:10] == requests(tokenizer, 10)
    assert len(set(first)) == 40
    kinds = {next(i for i, r in enumerate(REQUESTS) if text.startswith(r.split("{")[0])) for text in first}
    assert len(kinds) >= 8


def test_generate_writes_what_the_calibration_reads_and_resumes(tmp_path, provmark_home):
    out = tmp_path / "chat.jsonl"
    assert main(["generate", "--n", "2", "--tokens", "6", "--out", str(out)]) == 0
    outputs = read_outputs([str(out)])
    assert len(outputs) == 2 and len({o["prompt"] for o in outputs}) == 2
    written = out.read_text()
    assert main(["generate", "--n", "2", "--tokens", "6", "--out", str(out)]) == 0
    assert out.read_text() == written


@pytest.mark.parametrize("argv", [["recall", "--outputs", "/nonexistent.jsonl", "--out", "x.json"],
                                  ["generate", "--n", "0", "--out", "x.jsonl"]])
def test_bad_arguments_are_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "chat_outputs" in capsys.readouterr().err
