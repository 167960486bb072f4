"""``synthid:`` — our keyed tournament sampler (SynthID-Text, Dathathri et al. 2024): ``layers`` keyed binary
g-functions of (h prior tokens, token) (``watermark.synthid``); spec ``watermark.sampling_specs.SynthIDSpec``;
scored by the exact binomial tail of the g = 1 count (``watermark.schemes.sampling.Tournament``)."""

from __future__ import annotations

from watermark.sampling_specs import SynthIDSpec
from watermark.schemes.sampling import Tournament
from watermark.synthid import SynthIDWatermark


class SynthID(Tournament):
    name = prefix = "synthid"
    spec_type = SynthIDSpec
    example = "synthid:h=4,layers=30,top_k=40,prf=hmac-sha256,dedup=true"
    evaluation_preset = "synthid:h=4,layers=30,top_k=40,prf=hmac-sha256,dedup=true"  # Dathathri et al. 2024
    soft_binding = True
    spoof_check = True
    spoof_judged = True

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return SynthIDWatermark(spec, secret, vocab_size, key_id)

    def common_units_as(self, spec) -> str | None:
        return "lefthash"

    def label(self, spec) -> str:
        return f"{self.name}-h{spec.context_width}-m{spec.layers}"


FAMILY = SynthID()
