"""The detector must not be a colour oracle for a caller holding only a ``detect`` token.

Three attacks of the threat model, each run against the real detector (the Python API and the HTTP
service with a detect-scope token):

(a) one scored position: a 5-token text has exactly one scored unit under the default spec (h = 4), so
    any score field of its verdict that depends on that unit's colour reveals the colour;
(b) spec switching: a caller-chosen spec (other scheme or h) under the production key;
(c) gamma stepping: the production spec with another gamma locates a unit's green/red boundary.
"""

import pytest
from http_fixtures import call, make_token, serve, shared_vocabulary

from api.detector.app import create_app, services_of
from detector.service import Detector
from watermark.config import WatermarkSpec
from watermark.key_info import KeySpecError
from watermark.keys import Keyring

KEY = "k-oracle"
FIXED_SECRET = bytes.fromhex("0b7e4a1c93d25f8e6a0c1d2b3e4f5a6978a9bacbdcedfe0f1a2b3c4d5e6f7081")
SWITCHED_SPECS = ["kgw:scheme=selfhash,h=1,gamma=0.25,delta=2.0",
                  "kgw:scheme=lefthash,h=4,gamma=0.25,delta=2.0",
                  "kgw:scheme=minhash,h=4,gamma=0.25",
                  "kgw:scheme=unigram,gamma=0.25"]
GAMMA_STEPS = ["kgw:scheme=selfhash,h=4,gamma=0.5,delta=2.0", "kgw:scheme=selfhash,h=4,gamma=0.1,delta=2.0",
               "kgw:scheme=selfhash,h=4,gamma=0.9,delta=2.0"]


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create(KEY, secret=FIXED_SECRET)
    return ring


# ---- (b) spec switching and (c) gamma stepping ---------------------------------------------------------

@pytest.mark.parametrize("spec", SWITCHED_SPECS + GAMMA_STEPS)
def test_a_key_is_scored_only_under_its_own_spec_python_api(keyring, spec):
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    with pytest.raises(KeySpecError, match=KEY):
        detector.detect("a few words of text to score here", spec=spec)
    with pytest.raises(KeySpecError, match=KEY):
        detector.detect("a few words of text to score here", spec=spec, keys=[KEY])


def test_delta_and_hard_do_not_change_colours_and_stay_allowed(keyring):
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    for spec in ("kgw:scheme=selfhash,h=4,gamma=0.25,delta=3.0", "kgw:scheme=selfhash,h=4,gamma=0.25,hard"):
        assert detector.detect("a few words of text to score here", spec=spec).key_id in (KEY, None)


@pytest.mark.parametrize("spec", SWITCHED_SPECS + GAMMA_STEPS)
def test_a_key_is_scored_only_under_its_own_spec_http(provmark_home, keyring, spec):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    token = make_token(store, "detect")
    with serve(app) as base_url:
        for body in ({"text": "a few words of text", "watermark": spec},
                     {"text": "a few words of text", "watermark": spec, "keys": [KEY]}):
            status, answer, _ = call("POST", base_url + "/v1/detect", body, token=token)
            assert status == 422, answer
            assert answer["error"]["code"] == "spec_not_bound_to_key"
            assert KEY in answer["error"]["message"]
    store.close()


def test_hf_specs_need_no_key_and_stay_allowed(provmark_home, keyring):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    token = make_token(store, "detect")
    with serve(app) as base_url:
        status, answer, _ = call("POST", base_url + "/v1/detect",
                                 {"text": "a few words of text", "watermark": "hf:context_width=1"}, token=token)
        assert status == 200 and answer["key_id"] is None
    store.close()


def test_a_key_created_with_a_spec_is_bound_to_it(provmark_home):
    ring = Keyring(provmark_home)
    spec = WatermarkSpec.parse("kgw:scheme=lefthash,h=1,gamma=0.5")
    info = ring.create("k-left", spec=spec)
    assert WatermarkSpec.parse(info.spec) == spec
    detector = Detector(vocab=shared_vocabulary(), keyring=ring)
    assert detector.detect("a few words of text here", spec=spec).key_id == "k-left"
    with pytest.raises(KeySpecError):
        detector.detect("a few words of text here")  # the default spec is not this key's
