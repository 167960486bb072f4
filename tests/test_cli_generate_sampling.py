"""``provmark generate --watermark gumbel:...|synthid:...``: greedy and unsupported methods refused with one
line and exit 2 before the weights load; a first key bound to the requested spec; detectable output."""

from __future__ import annotations

import json

import pytest

from api.cli import main
from detector.scoring_sampling import score_text
from watermark.keys import Keyring
from watermark.scheme import make_watermark

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PROMPT = "Write a few sentences about the sea."
DETECTED_P = 1e-4  # see tests/test_generation_sampling_http.py


def _no_weights(*args, **kwargs):
    raise AssertionError("the model must not load for a refused request")


@pytest.mark.parametrize("argv, message", [
    (["--watermark", "gumbel:h=4", "--temperature", "0"], "cannot watermark greedy decoding"),
    (["--watermark", "synthid:h=4", "--temperature", "0"], "cannot watermark greedy decoding"),
    (["--watermark", "synthid:h=4", "--num-beams", "2", "--temperature", "0"], "greedy"),
    (["--watermark", "gumbel:h=4", "-n", "2", "--best-of", "2"], "would all be the same text"),
    (["--watermark", "vllm:gumbel,context_width=4"], "does not generate"),
])
def test_refused_before_the_model_loads(argv, message, monkeypatch, capsys):
    from api.cli import generate_run

    monkeypatch.setattr(generate_run, "load_model", _no_weights)
    code = main(["generate", PROMPT, *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and err.startswith("provmark: ") and err.count("\n") == 1


@pytest.mark.slow
def test_first_key_is_bound_to_the_sampling_spec_and_the_text_is_detected(loaded, monkeypatch, capsys):
    from api.cli import generate_run

    monkeypatch.setattr(generate_run, "load_model", lambda *a, **k: loaded)
    code = main(["generate", PROMPT, "--chat", "--watermark", "gumbel:h=4", "--max-new-tokens", "80",
                 "--ignore-eos", "--seed", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    body = json.loads(out)
    keyring = Keyring()
    (info,) = keyring.list()
    assert info.spec == "gumbel:h=4,prf=hmac-sha256,dedup=true" and body["watermark"]["key_id"] == info.key_id
    mark = make_watermark("gumbel:h=4", keyring.secret(info.key_id), loaded.model.config.vocab_size, info.key_id)
    assert score_text(mark, body["token_ids"]).p_value < DETECTED_P
    code = main(["generate", PROMPT, "--watermark", "synthid:h=4", "--key", info.key_id, "--max-new-tokens", "4"])
    assert code == 2 and "is bound to gumbel" in capsys.readouterr().err
