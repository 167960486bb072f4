"""WatermarkSpec strings, validation and fingerprints."""

import pytest

from watermark.config import SpecError, WatermarkSpec

DEFAULT = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,code_delta=3.5,prf=hmac-sha256"
# a spec string that leaves code_delta out has none (the specs keys were bound to before it existed)
PLAIN = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256"
HF_DEFAULT = "hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0,hashing_key=15485863,context_width=1"


def test_default_spec_is_the_authors_recommendation():
    spec = WatermarkSpec.default()
    assert (spec.scheme, spec.context_width, spec.gamma, spec.delta, spec.hard) == ("selfhash", 4, 0.25, 2.0, False)
    assert spec.format() == DEFAULT


@pytest.mark.parametrize("text", [
    DEFAULT,
    PLAIN,
    DEFAULT + ",hard",
    "kgw:scheme=lefthash,h=1,gamma=0.5,delta=1.5,prf=sha3-256",
    "kgw:scheme=minhash,h=3,gamma=0.1,delta=4.0,prf=hmac-sha256",
    "kgw:scheme=unigram,h=0,gamma=0.5,delta=2.0,prf=hmac-sha256",
    HF_DEFAULT,
    "hf:seeding_scheme=selfhash,greenlist_ratio=0.5,bias=2.5,hashing_key=42,context_width=3",
])
def test_format_parse_round_trip(text):
    spec = WatermarkSpec.parse(text)
    assert spec.format() == text
    assert WatermarkSpec.parse(spec.format()) == spec


def test_fields_left_out_take_defaults_and_order_does_not_matter():
    assert WatermarkSpec.parse("kgw:") == WatermarkSpec.parse(PLAIN) == WatermarkSpec.default().with_(code_delta=None)
    assert WatermarkSpec.parse("kgw:delta=2.0,scheme=selfhash, gamma=0.25 ,h=4,code_delta=3.5") == WatermarkSpec.default()
    assert WatermarkSpec.parse("kgw:scheme=unigram").context_width == 0
    assert WatermarkSpec.parse("kgw:hard").hard is True
    assert WatermarkSpec.parse("hf:") == WatermarkSpec.parse(HF_DEFAULT)


@pytest.mark.parametrize("text, field", [
    ("kgw:scheme=rainbow", "scheme"),
    ("kgw:h=0", "h"),
    ("kgw:h=four", "h"),
    ("kgw:h=65", "h"),
    ("kgw:gamma=1.0", "gamma"),
    ("kgw:gamma=0", "gamma"),
    ("kgw:gamma=abc", "gamma"),
    ("kgw:delta=-1", "delta"),
    ("kgw:delta=inf", "delta"),
    ("kgw:prf=md5", "prf"),
    ("kgw:colour=red", "colour"),
    ("kgw:h=2,h=3", "h"),
    ("kgw:scheme=unigram,h=2", "h"),
    ("kgw:hard=maybe", "hard"),
    ("hf:seeding_scheme=minhash", "scheme"),
    ("hf:greenlist_ratio=2", "gamma"),
    ("hf:bias", "bias"),
    ("hf:gamma=0.5", "gamma"),
    ("xyz:scheme=selfhash", "kind"),
    ("scheme=selfhash", "spec"),
    ("", "spec"),
])
def test_invalid_specs_name_the_field(text, field):
    with pytest.raises(SpecError) as err:
        WatermarkSpec.parse(text)
    assert str(err.value).startswith(field)


def test_fingerprint_is_stable_and_sensitive():
    base = WatermarkSpec.default()
    fp = base.fingerprint(49152)
    assert fp == WatermarkSpec.parse(DEFAULT).fingerprint(49152)
    assert len(fp) == 32 and int(fp, 16) >= 0
    variants = [
        base.fingerprint(50257),
        base.with_(scheme="minhash").fingerprint(49152),
        base.with_(context_width=3).fingerprint(49152),
        base.with_(gamma=0.5).fingerprint(49152),
        base.with_(delta=2.5).fingerprint(49152),
        base.with_(hard=True).fingerprint(49152),
        base.with_(prf="sha3-256").fingerprint(49152),
        WatermarkSpec.parse(HF_DEFAULT).fingerprint(49152),
    ]
    assert len({fp, *variants}) == len(variants) + 1
    with pytest.raises(SpecError):
        base.fingerprint(0)
