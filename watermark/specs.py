"""Every spec the project takes, one parser: a spec string is parsed once, where it enters (an HTTP body, a CLI
argument, the vLLM plugin), by its family's own parser (``watermark.schemes``), and travels as the spec value.

A spec value prints its canonical string (``format()``) and its fingerprint once each: both are kept on the
(frozen) value after the first call.
"""

from __future__ import annotations

from watermark import schemes
from watermark.config import SpecError, WatermarkSpec
from watermark.sampling_specs import SamplingSpec

AnySpec = WatermarkSpec | SamplingSpec


def parse_spec(spec: AnySpec | str | None) -> AnySpec:
    """The spec a string names (parsed by its family); a spec value as it is; the default spec for None.
    SpecError names what is wrong."""
    if spec is None:
        return WatermarkSpec.default()
    if isinstance(spec, str):
        return schemes.parse(spec)
    schemes.family_of(spec)  # a value of a registered family (SpecError otherwise)
    return spec


def parse_sampling_spec(text: str) -> SamplingSpec:
    """A sampling family's spec (SpecError for any other)."""
    spec = parse_spec(text)
    if not schemes.is_sampling(spec):
        raise SpecError(f"spec: expected a sampling watermark's spec, got {spec.format()!r}")
    return spec


def is_sampling_spec_text(text: str) -> bool:
    """Whether a spec string names a sampling family (without parsing it)."""
    return isinstance(text, str) and schemes.family_of_text(text).sampling


def is_sampling(spec: AnySpec) -> bool:
    """True for the sampling watermarks: the watermark chooses the token (no bias on the logits)."""
    return schemes.is_sampling(spec)

