"""``vllm:gumbel`` — vLLM's built-in Gumbel watermark (``WatermarkConfig(algorithm="gumbel")``, Philox PRF),
reproduced for detection (``watermark.vllm_gumbel``); keyed by a keyring key; spec
``watermark.sampling_specs.VLLMGumbelSpec``. Every token is scored (vLLM pads the contexts). Not generated here:
vLLM generates it."""

from __future__ import annotations

from watermark.sampling_specs import VLLMGumbelSpec
from watermark.schemes.sampling import GumbelRace
from watermark.vllm_gumbel import VLLMGumbel


class VLLMGumbelFamily(GumbelRace):
    name = "vllm:gumbel"
    old_names = ("vllm-gumbel",)
    prefix, tag = "vllm", "gumbel"
    spec_type = VLLMGumbelSpec
    example = "vllm:gumbel,context_width=4,dedup=true"
    scores_every_token = True
    generation_refusal = ("vllm:gumbel: provmark detects vLLM's Gumbel watermark but does not generate it (its "
                          "Philox race over the whole vocabulary is too costly here); generate with vLLM's "
                          "--watermark-config, or use a gumbel: spec")

    def claims(self, prefix: str, first_field: str | None) -> bool:
        return prefix == self.prefix  # vllm:<anything else> is refused by the spec's own parser, naming why

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return VLLMGumbel(spec, secret, vocab_size, key_id)


FAMILY = VLLMGumbelFamily()
