"""The generation service remembers what it wrote under each key, for the detector's spoof check.

A watermark thief learns colours (KGW) or unit scores (gumbel:, synthid:) from the service's output, so
the units it knows are the units that recur there; ``detector.spoof_check`` asks whether a positive text's
evidence sits on those. For that the detector needs, per key, in how many outputs each unit occurred and a
null of the service's own outputs. Both are written here, when an output's receipt is issued, into the
shared store (``db.output_memory``), with the unit identities the detector scores by. So are the output's
sampled 5-grams (``db.output_grams``), by which the detector recognises the output's wording after edits
that scrubbed its watermark (``matches_own_output``), and its words as keyed stem hashes with the receipt's id
(``db.semantic_memory``), by which it recognises a paraphrase (``paraphrase_of_own_output``).
"""

from __future__ import annotations

import logging

import torch

from db.output_grams import gram_key, output_grams
from db.output_memory import OutputMemory
from db.passage_signature import signature_key, text_signature_bytes
from db.semantic_memory import SemanticMemory
from db.store import Store, StoreError
from detector import common_units
from detector.normalize import normalize
from detector.spoof_check import has_check, output_null_z
from detector.your_units import YourUnits, scoring_table
from watermark.scheme import make_watermark
from watermark.specs import parse_spec
from watermark.vocab import encode

log = logging.getLogger(__name__)

MAX_CACHED_MARKS = 16  # specs are bound to keys, so a service sees a handful


class OwnOutput:
    """``remember`` each watermarked output of a keyring key under a spec the check takes (kgw:, gumbel:,
    synthid:; ``detector.spoof_check.has_check``)."""

    def __init__(self, store: Store, keyring, semantic: SemanticMemory | None = None) -> None:
        """``semantic``: where outputs' words go (default: the store's, newest DEFAULT_KEEP per key)."""
        self.memory = OutputMemory(store)
        self.semantic = semantic if semantic is not None else SemanticMemory(store)
        self._signature_key: bytes | None = None
        self.keyring = keyring
        self._marks: dict[tuple[str, str], object] = {}  # (spec, key id) -> Watermark, bounded below
        self._gram_key: int | None = None
        self._your_units: YourUnits | None = None  # detector.your_units, made on first use

    def remember(self, info, token_ids: list[int], vocab, text: str | None = None,
                 prompt_ids: list[int] | None = None, receipt_id: str | None = None) -> None:
        """The output's spoof z against what the key wrote before (a null sample), its units' counts and its
        sampled 5-grams minus its prompt's; ``info``: the output's ``WatermarkInfo`` (spec string, key id).
        The 5-grams are those of ``text`` as the detector tokenizes it (normalised), or of ``token_ids``
        when no text is given. Never fails the generation: an error is logged and the output is left out
        of the memory."""
        if info is None or info.key_id is None:
            return
        read = None if text is None else normalize(text).text  # what the detector reads: its normalised text
        seen = token_ids if read is None else encode(vocab, read)
        if receipt_id is not None:
            self._remember_words(info.key_id, receipt_id, read if read is not None else _decoded(vocab, seen))
        try:
            mark = self._mark(info.spec, info.key_id, vocab)
            if mark is None:
                return
            ids = torch.as_tensor(token_ids, dtype=torch.int64)
            z, identities = output_null_z(mark, ids, self._common(mark.spec, vocab), self.memory)
            if self._gram_key is None:
                self._gram_key = gram_key(self.keyring)
            self.memory.record(mark.key_id, identities, z, output_grams(seen, prompt_ids, self._gram_key))
        except StoreError as exc:
            log.warning("output not remembered for the spoof check: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the text is done and must still reach its caller
            log.error("output not remembered for the spoof check (%s)", type(exc).__name__)

    def _remember_words(self, key_id: str, receipt_id: str, text: str) -> None:
        """The output's words' signature (``db.passage_signature``, of the text the detector reads it as) under its
        key and receipt, unless the semantic memory is off. Never fails the generation."""
        if not self.semantic.enabled or not text:
            return
        try:
            if self._signature_key is None:
                self._signature_key = signature_key(self.keyring)
            self.semantic.record(key_id, receipt_id, text_signature_bytes(text, self._signature_key))
        except StoreError as exc:
            log.warning("output's words not remembered: %s", exc)
        except Exception as exc:  # noqa: BLE001 - the text is done and must still reach its caller
            log.error("output's words not remembered (%s)", type(exc).__name__)

    def _common(self, spec, vocab):
        """The table the detector scores ``spec`` with: the shipped one, and the deployment's own texts' units."""
        if self._your_units is None:
            self._your_units = YourUnits(self.keyring)
        return scoring_table(common_units.for_spec(spec, vocab), self._your_units.table(vocab.fingerprint))

    def _mark(self, spec_text: str, key_id: str, vocab):
        """The output's watermark (None for specs without the check), cached like the generation watermarks."""
        found = self._marks.get((spec_text, key_id))
        if found is None:
            spec = parse_spec(spec_text)
            if not has_check(spec):
                return None
            found = make_watermark(spec, self.keyring.secret(key_id), vocab.vocab_size, key_id)
            if len(self._marks) >= MAX_CACHED_MARKS:
                self._marks.clear()
            self._marks[(spec_text, key_id)] = found
        return found


def _decoded(vocab, token_ids: list[int]) -> str:
    """The text of ``token_ids`` (special tokens left out), for an output given as ids alone."""
    return vocab.tokenizer.decode(list(token_ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)
