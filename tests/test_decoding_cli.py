"""``provmark generate`` with the decoding options: JSON shape, text output, and exit 2 on bad combinations.

One real subprocess run; the other runs call api.cli.main in-process with the model loaded once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from api.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = "The capital of France is"
CHOICE_FIELDS = {"index", "text", "token_ids", "finish_reason", "cumulative_logprob"}


@pytest.fixture
def generate(loaded, monkeypatch, capsys):
    """Run ``provmark generate ARGS`` in-process over the module's model: (exit code, stdout, stderr)."""
    from api.cli import generate_run

    monkeypatch.setattr(generate_run, "load_model", lambda *a, **k: loaded)  # the name the command calls

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["generate", PROMPT, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.mark.parametrize("argv, message", [
    (["--length-penalty", "2"], "--length-penalty: only used with --num-beams"),
    (["--draft-model", "x"], "--draft-model: only used with --speculative"),
    (["--num-beams", "2", "--mbr", "4"], "--num-beams and --mbr: choose one decoding method"),
    (["--speculative", "prompt-lookup", "--contrastive-amateur", "x"], "choose one decoding method"),
    (["--num-beams", "2", "-n", "3"], "-n 3: must be <= beam.num_beams=2"),
    (["--num-beams", "0"], "--num-beams 0: must be an int >= 1"),
    (["--best-of", "2", "-n", "3"], "--best-of 2: must be >= n=3"),
    (["--num-beams", "2", "--best-of", "2"], "--best-of 2: applies to sampling only"),
    (["--num-beams", "2", "--temperature", "0.7"], "--temperature 0.7 with beam search"),
    (["--num-beams", "2", "--top-p", "0.5"], "--top-p 0.5 with beam search"),
    (["--num-beams", "2", "--mirostat", "2"], "--mirostat 2 with beam search"),
    (["-n", "2", "--temperature", "0"], "greedy siblings would all be identical"),
    (["--mbr", "1"], "--mbr 1: must be in"),
    (["--mbr", "4", "--mbr-similarity", "bleu"], "--mbr-similarity 'bleu'"),
])
def test_bad_decoding_options_exit_2_with_one_line(argv, message, capsys):
    code = main(["generate", PROMPT, "--no-watermark", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.startswith("provmark: ") and err.count("\n") == 1


def test_unknown_early_stopping_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", PROMPT, "--num-beams", "2", "--early-stopping", "maybe"])
    assert exc.value.code == 2 and "--early-stopping" in capsys.readouterr().err


@pytest.mark.slow
def test_beam_search_json_in_a_real_subprocess(tmp_path):
    env = dict(os.environ, PROVMARK_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    cli = [sys.executable, "-c", "import sys; from api.cli import main; sys.exit(main())"]
    done = subprocess.run(cli + ["generate", PROMPT, "--num-beams", "3", "-n", "2", "--length-penalty", "1.0",
                                 "--early-stopping", "never", "--max-new-tokens", "8", "--json"],
                          check=False, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    choices = body["choices"]
    assert len(choices) == 2 and all(set(c) >= CHOICE_FIELDS for c in choices)
    assert [c["index"] for c in choices] == [0, 1]
    assert choices[0]["cumulative_logprob"] >= choices[1]["cumulative_logprob"] or \
        choices[0]["decoding_stats"]["beam_score"] >= choices[1]["decoding_stats"]["beam_score"]
    first = choices[0]
    assert (body["text"], body["token_ids"], body["finish_reason"], body["cumulative_logprob"]) == \
        (first["text"], first["token_ids"], first["finish_reason"], first["cumulative_logprob"])
    assert body["decoding_stats"]["num_beams"] == 3 and body["watermark"]["key_id"]
    assert body["usage"]["completion_tokens"] == len(body["token_ids"]) <= 8


@pytest.mark.slow
def test_best_of_json_and_text_in_process(generate):
    argv = ["--best-of", "3", "-n", "2", "--seed", "5", "--max-new-tokens", "6", "--no-watermark"]
    code, out, _ = generate(*argv, "--json")
    assert code == 0
    body = json.loads(out)
    assert len(body["choices"]) == 2 and body["watermark"] is None
    assert body["choices"][0]["cumulative_logprob"] >= body["choices"][1]["cumulative_logprob"]
    assert body["cumulative_logprob"] == body["choices"][0]["cumulative_logprob"]
    code, text, _ = generate(*argv)
    assert code == 0
    assert text == "".join(f"=== choice {i} ===\n{c['text']}\n" for i, c in enumerate(body["choices"]))


@pytest.mark.slow
def test_plain_generation_output_is_unchanged(generate):
    """No decoding option, or -n 1 --best-of 1: the engine's own path, no decoding fields in the JSON."""
    argv = ["--seed", "3", "--max-new-tokens", "6", "--no-watermark", "--json"]
    code, out, _ = generate(*argv)
    code_one, out_one, _ = generate(*argv, "-n", "1", "--best-of", "1")
    assert code == code_one == 0
    body = json.loads(out)
    assert body == json.loads(out_one)
    assert not {"choices", "cumulative_logprob", "decoding_stats"} & set(body)
