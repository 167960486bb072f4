"""gumbel:, synthid:, hf:synthid and vllm:gumbel spec strings: round trips, defaults, clear errors."""

import pytest

from watermark.config import SpecError, WatermarkSpec
from watermark.sampling_specs import (
    GumbelSpec,
    HFSynthIDSpec,
    SynthIDSpec,
    VLLMGumbelSpec,
    sampling_fingerprint,
    vllm_key_from_secret,
)
from watermark.specs import is_sampling_spec_text, parse_sampling_spec


@pytest.mark.parametrize("text, expected", [
    ("gumbel:", GumbelSpec()),
    ("gumbel:h=2,prf=sha3-256,dedup=false", GumbelSpec(2, "sha3-256", False)),
    ("synthid:layers=12", SynthIDSpec(layers=12)),
    ("synthid:top_k=0", SynthIDSpec(top_k=0)),
    ("hf:synthid,keys=654:400:836,ngram_len=3", HFSynthIDSpec(keys=(654, 400, 836), ngram_len=3)),
    ("vllm:gumbel,context_width=2", VLLMGumbelSpec(context_width=2)),
])
def test_parse_and_format_round_trip(text, expected):
    spec = parse_sampling_spec(text)
    assert spec == expected
    assert parse_sampling_spec(spec.format()) == spec
    assert is_sampling_spec_text(text)


def test_kgw_specs_are_not_sampling_specs():
    assert not is_sampling_spec_text("kgw:scheme=selfhash")
    assert not is_sampling_spec_text("hf:seeding_scheme=lefthash")


@pytest.mark.parametrize("text, field", [
    ("gumbel:h=0", "h"), ("gumbel:h=65", "h"), ("gumbel:prf=md5", "prf"), ("gumbel:gamma=0.5", "gamma"),
    ("synthid:layers=0", "layers"), ("synthid:layers=65", "layers"), ("gumbel:dedup=maybe", "dedup"),
    ("synthid:top_k=-1", "top_k"),
    ("hf:synthid,ngram_len=5", "keys"), ("hf:synthid,keys=1:x", "keys"), ("hf:synthid,keys=1,ngram_len=1", "ngram_len"),
    ("hf:synthid,keys=1,sampling_table_size=33554432", "sampling_table_size"),
    ("vllm:sbw", "vllm"), ("vllm:gumbel,context_width=17", "h"), ("gumbel:h=4,h=5", "h"),
])
def test_bad_specs_name_the_field(text, field):
    with pytest.raises(SpecError, match=field):
        parse_sampling_spec(text)


def test_fingerprint_depends_on_spec_and_vocabulary():
    a, b = GumbelSpec(), GumbelSpec(context_width=3)
    assert sampling_fingerprint(a, 100) != sampling_fingerprint(b, 100)
    assert sampling_fingerprint(a, 100) != sampling_fingerprint(a, 101)
    assert sampling_fingerprint(a, 100) != WatermarkSpec().fingerprint(100)


def test_vllm_key_is_a_64_bit_integer_of_the_secret_and_never_in_the_spec():
    secret = bytes(range(32))
    key = vllm_key_from_secret(secret)
    assert 0 <= key < 2**64 and key == vllm_key_from_secret(secret) != vllm_key_from_secret(bytes(32))
    assert str(key) not in VLLMGumbelSpec().format()


@pytest.mark.parametrize("text", ["gumbel:h=4", "synthid:", "hf:synthid,keys=1:2", "vllm:gumbel"])
def test_the_kgw_parser_refuses_sampling_specs_with_a_clear_message(text):
    with pytest.raises(SpecError, match="sampling watermarks"):
        WatermarkSpec.parse(text)


def test_one_constructor_builds_each_kind():
    from watermark.sampling_scheme import sampling_watermark

    secret = bytes(range(32))
    kinds = {sampling_watermark(t, secret, 100).spec.kind for t in ("gumbel:", "synthid:", "vllm:gumbel")}
    assert kinds == {"gumbel", "synthid", "vllm:gumbel"}  # one spelling: the family's name, as in its specs
    assert sampling_watermark("hf:synthid,keys=1:2", None, 100).spec.kind == "hf:synthid"
    with pytest.raises(ValueError, match="key"):
        sampling_watermark("hf:synthid,keys=1:2", secret, 100)
    with pytest.raises(ValueError, match="key"):
        sampling_watermark("gumbel:", None, 100)
