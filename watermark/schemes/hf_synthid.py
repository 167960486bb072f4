"""``hf:synthid`` — transformers' ``SynthIDTextWatermarkLogitsProcessor`` reproduced bit for bit
(``watermark.hf_synthid``), its public integer keys in the spec (``watermark.sampling_specs.HFSynthIDSpec``);
its context window follows transformers' processor state (``HFContextWindow``), so drafted positions are not
served. Scored as a tournament (``watermark.schemes.sampling.Tournament``), every position counted."""

from __future__ import annotations

from watermark.field_error import FieldError
from watermark.hf_synthid import HFContextWindow, HFSynthID
from watermark.sampling_specs import HFSynthIDSpec
from watermark.schemes.sampling import Tournament


class HFSynthIDFamily(Tournament):
    name = "hf:synthid"
    old_names = ("hf-synthid",)
    prefix, tag = "hf", "synthid"
    spec_type = HFSynthIDSpec
    example = "hf:synthid,keys=654:400:836,ngram_len=5"
    needs_key = False
    committed_context_only = True
    context_memory = HFContextWindow

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        if secret is not None or key_id is not None:
            raise FieldError("key", "hf:synthid specs carry their own keys; do not name a keyring key")
        return HFSynthID(spec, vocab_size)

    def label(self, spec) -> str:
        return f"hf-synthid-h{spec.context_width}-m{spec.layers}"


FAMILY = HFSynthIDFamily()
