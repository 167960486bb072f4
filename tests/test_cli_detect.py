"""``provmark detect``: outputs, JSON lines, errors and exit codes (in-process, real keyring)."""

import io
import json
import shutil

import pytest

from api.cli import main
from watermark.vocab import load_vocabulary

TEXT = ("The committee met on Tuesday to discuss the budget. Members argued about the cost of the new "
        "bridge, and the chair promised a decision within a month after hearing from residents.")
FIELDS = ("verdict", "z_score", "p_value", "num_tokens_scored", "num_green_tokens", "green_fraction", "key_id",
          "watermark", "spec_fingerprint", "fingerprint", "windows", "normalizations")


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def run(capsys, *argv):
    code = main(["detect", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_verdict_with_all_detection_keys_and_no_secret(capsys, keyring, text_file):
    code, out, err = run(capsys, text_file, "--json", "--windows")
    assert code == 0, err
    verdict = json.loads(out)
    assert all(field in verdict for field in FIELDS)
    assert verdict["spec_fingerprint"] == verdict["fingerprint"]  # the old name, kept one release
    assert {k["key_id"] for k in verdict["keys"]} == {"alpha", "beta"}
    assert verdict["verdict"] in ("not_watermarked", "insufficient_text")
    for key_id in ("alpha", "beta"):
        assert keyring.secret(key_id).hex() not in out


def test_stdin_text_output_and_explain(capsys, keyring, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(TEXT))
    code, out, _ = run(capsys, "-", "--key", "alpha", "--explain")
    assert code == 0
    assert out.startswith("verdict: ") and "key: alpha" in out and "'The'" in out


def test_jsonl_one_verdict_per_line(capsys, keyring, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [{"text": TEXT}, {"id": "b", "text": "Short."}]) + "\n")
    code, out, _ = run(capsys, "--jsonl", path, "--key", "beta")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 2 and lines[1]["id"] == "b" and lines[1]["verdict"] == "insufficient_text"
    assert lines[0]["key_id"] == "beta" and lines[0]["spec_fingerprint"] == lines[0]["fingerprint"]


def test_hf_spec_needs_no_key(capsys, text_file):
    code, out, err = run(capsys, text_file, "--json", "--watermark", "hf:context_width=1")
    assert code == 0, err
    assert json.loads(out)["key_id"] is None


@pytest.mark.parametrize("argv, message", [
    (["--key", "nope"], "no key nope"),
    (["--watermark", "kgw:gamma=7"], "gamma"),
    (["--watermark", "hf:context_width=1", "--key", "alpha"], "takes no key"),
])
def test_user_errors_exit_2_with_a_message(capsys, keyring, text_file, argv, message):
    code, out, err = run(capsys, text_file, *argv)
    assert code == 2 and out == "" and message in err


def test_unreadable_file_and_empty_keyring_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, tmp_path / "missing.txt")
    assert code == 2 and "cannot read" in err
    (tmp_path / "t.txt").write_text(TEXT)
    code, _, err = run(capsys, tmp_path / "t.txt")
    assert code == 2 and "keys create" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    code, _, err = run(capsys, "--jsonl", bad, "--watermark", "hf:context_width=1")
    assert code == 2 and ":2:" in err


def test_model_folder_picks_its_tokenizer(capsys, keyring, text_file, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    vocab = load_vocabulary()
    vocab.tokenizer.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"vocab_size": vocab.vocab_size}))
    code, out, err = run(capsys, text_file, "--json", "--model", folder)
    assert code == 0, err
    verdict = json.loads(out)
    assert verdict["model_id"] == "my-model" and verdict["tokenizer_fingerprint"] == vocab.fingerprint
    shutil.rmtree(folder)
    code, _, err = run(capsys, text_file, "--model", folder)
    assert code == 2 and "model folder" in err
