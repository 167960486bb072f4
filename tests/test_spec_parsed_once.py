"""A spec is parsed once, where it enters: one POST /v1/detect parses its spec string exactly once (every family's
parser counted), and the spec value keeps its canonical string and fingerprint after the first call."""

import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary, watermarked_text

from api.detector.app import create_app, services_of
from watermark import schemes
from watermark.keys import Keyring
from watermark.specs import parse_spec

KEY = "k-once"
TEXT = ("The river bank was quiet that morning, and the old ferryman watched the fog lift off the water while "
        "gulls argued over the nets drying on the pier. ") * 12


@pytest.fixture
def parses(monkeypatch):
    """Every call of a family's spec parser with a string, as (type name, text)."""
    seen = []
    for spec_type in dict.fromkeys(family.spec_type for family in schemes.FAMILIES):  # kgw and hf share one
        original = spec_type.__dict__["parse"].__func__

        def counting(cls, text, _original=original):
            if isinstance(text, str):
                seen.append((cls.__name__, text))
            return _original(cls, text)

        monkeypatch.setattr(spec_type, "parse", classmethod(counting))
    return seen


@pytest.mark.parametrize("spec_text", ["kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0", "gumbel:h=4"])
def test_one_detect_request_parses_its_spec_once(provmark_home, parses, spec_text):
    ring = Keyring(provmark_home)
    ring.create(KEY, spec=spec_text)
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    token = make_token(store, "detect")
    text = watermarked_text(shared_vocabulary(), ring.secret(KEY), TEXT) if spec_text.startswith("kgw") else TEXT
    with serve(app) as base_url:
        call("POST", base_url + "/v1/detect", {"text": "warm up", "watermark": spec_text, "keys": [KEY]}, token=token)
        parses.clear()  # the first request of a process may read the keyring's bound specs into its cache
        status, body, _ = call("POST", base_url + "/v1/detect", {"text": text, "watermark": spec_text, "keys": [KEY]},
                               token=token)
        found = list(parses)
    store.close()
    assert status == 200, body
    assert body["watermark"] == parse_spec(spec_text).format()
    assert found == [(type(parse_spec(spec_text)).__name__, spec_text)]


def test_a_spec_value_prints_and_fingerprints_once():
    spec = parse_spec("synthid:h=4,layers=30")
    assert spec.format() is spec.format()  # the same string object: kept on the value
    assert spec.fingerprint(49152) is spec.fingerprint(49152)
    assert spec.fingerprint(100) != spec.fingerprint(49152)
    assert parse_spec(spec.format()) == spec and hash(parse_spec(spec.format())) == hash(spec)
