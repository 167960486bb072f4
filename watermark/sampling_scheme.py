"""One constructor for the sampling watermarks: a spec (string or value) bound to its key material."""

from __future__ import annotations

from watermark.gumbel import GumbelWatermark
from watermark.hf_synthid import HFSynthID
from watermark.sampling_specs import (
    GumbelSpec,
    HFSynthIDSpec,
    SamplingSpec,
    SynthIDSpec,
    VLLMGumbelSpec,
    parse_sampling_spec,
)
from watermark.synthid import SynthIDWatermark
from watermark.vllm_gumbel import VLLMGumbel


def sampling_watermark(spec: SamplingSpec | str, secret: bytes | None, vocab_size: int, key_id: str | None = None):
    """The watermark of a ``gumbel:``, ``synthid:``, ``hf:synthid`` or ``vllm:gumbel`` spec. hf:synthid
    carries public keys and takes no secret (a secret given for it is refused, as for hf: specs)."""
    spec = parse_sampling_spec(spec) if isinstance(spec, str) else spec
    if isinstance(spec, HFSynthIDSpec):
        if secret is not None or key_id is not None:
            raise ValueError("key: hf:synthid specs carry their own keys; do not name a keyring key")
        return HFSynthID(spec, vocab_size)
    if isinstance(spec, GumbelSpec):
        return GumbelWatermark(spec, secret, vocab_size, key_id)
    if isinstance(spec, SynthIDSpec):
        return SynthIDWatermark(spec, secret, vocab_size, key_id)
    if isinstance(spec, VLLMGumbelSpec):
        return VLLMGumbel(spec, secret, vocab_size, key_id)
    raise ValueError(f"not a sampling watermark spec: {spec!r}")
