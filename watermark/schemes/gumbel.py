"""``gumbel:`` — our keyed Gumbel-max sampler (Aaronson): token = argmax_v log(r_v) / p_v with r_v from our PRF
(``watermark.gumbel``); spec ``watermark.sampling_specs.GumbelSpec``; scored by the Gamma tail of the summed
s = -log(1 - r) (``watermark.schemes.sampling.GumbelRace``)."""

from __future__ import annotations

from watermark.gumbel import GumbelWatermark
from watermark.sampling_specs import GumbelSpec
from watermark.schemes.sampling import GumbelRace


class Gumbel(GumbelRace):
    name = prefix = "gumbel"
    spec_type = GumbelSpec
    example = "gumbel:h=4,prf=hmac-sha256,dedup=true"
    evaluation_preset = "gumbel:h=4,prf=hmac-sha256,dedup=true"  # Aaronson's exponential minimum, our PRF
    soft_binding = True
    spoof_check = True  # its z is reported; genuine output recurs on its own best units, so no ``suspected``

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return GumbelWatermark(spec, secret, vocab_size, key_id)

    def common_units_as(self, spec) -> str | None:
        return "lefthash"  # a unit is (h context tokens, token), as lefthash's


FAMILY = Gumbel()
