"""One constructor for the sampling watermarks: a spec (string or value) bound to its key material, by its family
(``watermark.schemes``)."""

from __future__ import annotations

from watermark import schemes
from watermark.specs import parse_sampling_spec


def sampling_watermark(spec, secret: bytes | None, vocab_size: int, key_id: str | None = None):
    """The watermark of a sampling family's spec. A family whose spec carries public keys (hf:synthid) takes no
    secret (one given is refused, as for hf: specs)."""
    spec = parse_sampling_spec(spec) if isinstance(spec, str) else spec
    return schemes.family_of(spec).make(spec, secret, vocab_size, key_id)
