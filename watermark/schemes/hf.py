"""``hf:`` — transformers' ``WatermarkingConfig`` green lists, with transformers' own parameter names and its
public integer key in the spec (``watermark.hf_compat``), so text from ``model.generate(watermarking_config=...)``
is detected here; the same spec type and bias as ``kgw:`` (``watermark.config.WatermarkSpec``)."""

from __future__ import annotations

from watermark.config import HF_KIND, WatermarkSpec
from watermark.green_watermark import Watermark
from watermark.schemes.family import SchemeFamily


class HF(SchemeFamily):
    name = prefix = HF_KIND
    spec_type = WatermarkSpec
    example = "hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0,hashing_key=15485863,context_width=1"
    needs_key = False
    green_list = True

    def claims(self, prefix: str, first_field: str | None) -> bool:
        return prefix == self.prefix and first_field != "synthid"  # hf:synthid is its own family

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return Watermark(spec, secret, vocab_size, key_id, public_half)

    def label(self, spec) -> str:
        return f"hf-{spec.scheme}-h{spec.context_width}-g{spec.gamma:g}-d{spec.delta:g}"


FAMILY = HF()
