"""Every spec the project takes, one parser: ``kgw:`` / ``hf:`` (``watermark.config.WatermarkSpec``, the
red/green-list bias) and the sampling watermarks ``gumbel:``, ``synthid:``, ``hf:synthid`` and
``vllm:gumbel`` (``watermark.sampling_specs``, the keyed sampler itself).

Callers that can serve either family parse with ``parse_spec`` and build with
``watermark.scheme.make_watermark``; code that only handles the bias keeps ``WatermarkSpec.parse``, which
refuses sampling specs with a message naming them.
"""

from __future__ import annotations

from watermark.config import WatermarkSpec
from watermark.sampling_specs import SamplingSpec, is_sampling_spec_text, parse_sampling_spec

AnySpec = WatermarkSpec | SamplingSpec
SAMPLING_SPEC_TYPES = SamplingSpec.__args__  # GumbelSpec, SynthIDSpec, HFSynthIDSpec, VLLMGumbelSpec


def parse_spec(spec: AnySpec | str | None) -> AnySpec:
    """The spec a string (or value) names; the default spec for None. SpecError names what is wrong."""
    if spec is None:
        return WatermarkSpec.default()
    if isinstance(spec, (WatermarkSpec, *SAMPLING_SPEC_TYPES)):
        return spec
    if is_sampling_spec_text(spec):
        return parse_sampling_spec(spec)
    return WatermarkSpec.parse(spec)


def is_sampling(spec: AnySpec) -> bool:
    """True for the sampling watermarks: the watermark chooses the token (no bias on the logits)."""
    return isinstance(spec, SAMPLING_SPEC_TYPES)
