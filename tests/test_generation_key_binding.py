"""Generation scores nothing, but what it writes under a key is a sample of that key's colours: a generate
caller who may pick any spec under the production key gets ``selfhash, h=1`` text whose statistics predict
the key's ``h=4`` colours (docs/security.md). So generation, like detection, uses a key only under its own
spec; a request that names no spec gets the key's own (not the default spec)."""

from __future__ import annotations

import pytest

from api.cli import main
from watermark.keys import Keyring

PROMPT = "Write a few sentences about the sea."
H1 = "kgw:scheme=selfhash,h=1,gamma=0.25,delta=2,prf=hmac-sha256"


def _no_weights(*args, **kwargs):
    raise AssertionError("the model must not load for a refused request")


@pytest.fixture
def no_model(monkeypatch):
    from api.cli import generate_run

    monkeypatch.setattr(generate_run, "load_model", _no_weights)


@pytest.mark.parametrize("spec", [H1, "kgw:scheme=selfhash,h=4,gamma=0.5,delta=2", "kgw:scheme=lefthash,h=4",
                                  "kgw:scheme=selfhash,h=4,prf=sha3-256"])
def test_a_kgw_spec_with_other_colours_is_refused_under_a_key_bound_to_the_default(spec, no_model, capsys):
    info = Keyring().create()  # bound to the default spec
    code = main(["generate", PROMPT, "--watermark", spec, "--key", info.key_id, "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"key {info.key_id} is bound to kgw:scheme=selfhash,h=4" in err and err.count("\n") == 1


def test_the_active_key_is_guarded_too(no_model, capsys):
    Keyring().create()
    assert main(["generate", PROMPT, "--watermark", H1, "--max-new-tokens", "4"]) == 2
    assert "is bound to" in capsys.readouterr().err


def test_delta_and_hard_may_differ(no_model):
    """They set how strongly green tokens are favoured, never which are green: the text stays verifiable."""
    info = Keyring().create()
    with pytest.raises(AssertionError, match="must not load"):  # past every check, at the weights
        main(["generate", PROMPT, "--watermark", "kgw:scheme=selfhash,h=4,gamma=0.25,delta=5,hard=true",
              "--key", info.key_id, "--max-new-tokens", "4"])


def test_no_spec_means_the_keys_own_spec(no_model, capsys):
    """A key bound to gumbel generates gumbel text when the request names no spec: greedy is then refused
    as for ``--watermark gumbel:...`` (before, the default KGW spec was used under the gumbel key)."""
    info = Keyring().create(spec="gumbel:h=4")
    code = main(["generate", PROMPT, "--key", info.key_id, "--temperature", "0", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "cannot watermark greedy decoding" in err, err


def test_detect_with_a_key_and_no_spec_scores_under_the_keys_own_spec(capsys, tmp_path):
    """The other half: `provmark detect --key ID` verifies what `provmark generate --key ID` wrote."""
    import json

    info = Keyring().create(spec="gumbel:h=4")
    other = Keyring().create(spec="synthid:h=4")
    text = tmp_path / "text.txt"
    text.write_text("The sea was calm that morning, and the boats went out before the sun rose.")
    assert main(["detect", str(text), "--key", info.key_id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["watermark"].startswith("gumbel:h=4")
    assert main(["detect", str(text), "--key", info.key_id, "--key", other.key_id]) != 0
    assert "bound to different specs" in capsys.readouterr().err
