"""``kgw:`` — our keyed red/green-list watermark (Kirchenbauer et al. 2023): the spec is
``watermark.config.WatermarkSpec``, the bias and the green flags ``watermark.green_watermark.Watermark``,
scored by G of T (``detector.scoring``, ``detector.kgw_verdict``)."""

from __future__ import annotations

from watermark.config import KGW_KIND, WatermarkSpec
from watermark.green_watermark import Watermark
from watermark.schemes.family import SchemeFamily


class KGW(SchemeFamily):
    name = prefix = KGW_KIND
    spec_type = WatermarkSpec
    example = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0"
    green_list = True
    two_part = True
    soft_binding = True
    spoof_check = True
    spoof_judged = True

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return Watermark(spec, secret, vocab_size, key_id, public_half)

    def common_units_as(self, spec) -> str | None:
        return spec.scheme  # each context scheme has its own threshold (detector.common_units.THRESHOLDS)

    def label(self, spec) -> str:
        return f"{spec.scheme}-h{spec.context_width}-g{spec.gamma:g}-d{spec.delta:g}" + ("-hard" if spec.hard else "")


FAMILY = KGW()
