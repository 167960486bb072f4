"""``paraphrase_of_own_output``: does a text restate, in other words, one output the service remembers?

The watermark and the 5-gram match (``db.output_grams``) read the tokens; a paraphrase replaces them and keeps what
the text says and many of its content words. The semantic memory (``db.semantic_memory``) keeps, per output, its
words' signature (``db.passage_signature``: keyed stem hashes and counts). A verdict reads the text's stems from the
text the detector tokenized, asks each tested key's copy (``SignatureMirror``: an inverted index in this process,
``db.signature_index``) for the remembered output whose words are closest (the exact cosine of the two TF-IDF
vectors, over every output held), and names it when that similarity clears the calibrated threshold. The fact it
adds: that words similarity, the false-match rate it carries, whether it clears the threshold, and then that
output's receipt id. It never changes the watermark verdict. A lookup that had to leave a long text's commonest
stems out (``Scored.exact`` false: past ``db.signature_index.MAX_POSTINGS`` postings) compares its CANDIDATES best
outputs exactly, with their signatures read from the store.

The false-match rate comes from the calibration shipped beside this module (``data/paraphrase_null.json``, made by
``python -m evaluation.paraphrase_calibration``): per pair (one text, one unrelated remembered output), how often
human text and other outputs of the same model reach a words similarity, on the fit half of the human corpora
(``detector.human_corpora``) and of the model's outputs (``ParaphraseNull.pair_rate``). A text searched against
``n`` outputs is falsely matched with probability at most ``n`` times that pair rate (a union bound, no
independence assumed): ``false_match_rate`` for human text, ``other_output_rate`` for an unrelated output of the
model (the named receipt would be the wrong one). The threshold (``matched``: not a text nobody generated) is the
lowest similarity on the grid that at most one in 10^4 fit human passages and fit outputs reach against the other
outputs, checked on the held-out halves (docs/detection.md, "Paraphrases of our own output").
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import threading
from dataclasses import dataclass
from pathlib import Path

from db.passage_signature import StemKey, parse, shipped_words, signature_key, stem_key, text_signature
from db.passage_signature import similarity as words_similarity
from detector.key_source import has_master_key

NULL_FILE = Path(__file__).with_name("data") / "paraphrase_null.json"
# a lookup that left stems out compares this many of its best outputs exactly (db.signature_index.MAX_POSTINGS)
CANDIDATES = 16
FIELD_DESCRIPTION = (  # the verdict field's description in the HTTP API (api/detector/schemas.py)
    "keyed verdicts where the service keeps its outputs' words (PROVMARK_SEMANTIC_OUTPUTS): matched, the text "
    "restates one remembered output of a tested key in other words (the output whose words are closest, at a words "
    "similarity at or above the calibrated threshold); it never changes the verdict. The detect scope sees matched "
    "only; explain and admin also similarity (the cosine of the two texts' weighted word stems; 0 when they share "
    "none), the false-match rate the similarity carries against the outputs searched (how often human text reaches "
    "it), other_output_rate (how often an unrelated output of the model does: a wrong receipt), the threshold, "
    "outputs_searched, and for a match the output's receipt_id and key_id. None when no tested key has remembered "
    "outputs")


@dataclass(frozen=True)
class ParaphraseNull:
    """Pair exceedances on a similarity grid: ``rate(s)`` is the larger of the nulls' (k + 1) / (pairs + 1),
    k the pairs at or above s (an upper estimate that is never 0)."""

    grid: tuple[float, ...]  # ascending similarities
    nulls: dict  # name -> {"pairs": P, "texts": N, "outputs": M, "exceed": [k per grid point]}
    threshold: float
    source: str = ""

    @classmethod
    def from_dict(cls, data: dict) -> ParaphraseNull:
        grid = tuple(float(s) for s in data["grid"])
        if list(grid) != sorted(grid) or not grid:
            raise ValueError("paraphrase null: the grid must be a non-empty ascending list")
        for name, null in data["nulls"].items():
            if len(null["exceed"]) != len(grid):
                raise ValueError(f"paraphrase null {name!r}: one exceedance count per grid point expected")
        return cls(grid, dict(data["nulls"]), float(data["threshold"]), data.get("source", ""))

    def pair_rate(self, similarity: float, names: tuple[str, ...] | None = None) -> float:
        """The false-match rate of one pair at ``similarity`` (the grid point at or below it): the largest
        (k + 1) / (pairs + 1) of the nulls ``names`` (None: all) that have pairs there (k > 0), and never below the
        finest of them's 1 / (pairs + 1). Past the highest similarity a null reached it says nothing more: there
        the best-resolved null bounds the rate alone."""
        nulls = [null for name, null in self.nulls.items() if names is None or name in names]
        if not nulls:
            raise ValueError(f"paraphrase null: none of {names} is calibrated")
        at = bisect.bisect_right(self.grid, similarity) - 1
        floor = min(1.0 / (null["pairs"] + 1) for null in nulls)
        worst = floor
        for null in nulls:
            k = null["pairs"] if at < 0 else null["exceed"][at]
            if k > 0:
                worst = max(worst, (k + 1) / (null["pairs"] + 1))
        return min(1.0, worst)

    def false_match_rate(self, similarity: float, searched: int, names: tuple[str, ...] = ("human",)) -> float:
        """A text's false-match rate against ``searched`` outputs: at most ``searched`` times the pair rate of the
        nulls ``names``: by default human text (how often a text nobody generated reaches ``similarity``);
        ``("outputs",)``: another output of the model, unrelated to the remembered one (a wrong receipt)."""
        return min(1.0, max(1, searched) * self.pair_rate(similarity, names))

    def summary(self) -> dict:
        return {name: {k: null[k] for k in ("pairs", "texts", "outputs")} for name, null in self.nulls.items()}


@functools.cache
def shipped_null() -> ParaphraseNull:
    """The calibration shipped with the package (``NULL_FILE``)."""
    return ParaphraseNull.from_dict(json.loads(NULL_FILE.read_text()))


class ParaphraseMatcher:
    """The ``paraphrase_of_own_output`` fact of a text under the tested keys, from a ``SignatureMirror``."""

    def __init__(self, mirror, keyring_of, null: ParaphraseNull | None = None) -> None:
        """``keyring_of``: returns the keyring (the detector's, made on first use)."""
        self.mirror = mirror
        self.keyring_of = keyring_of
        self.null = null if null is not None else shipped_null()
        self._key: StemKey | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.mirror is not None and self.mirror.enabled

    def words_key(self) -> StemKey | None:
        """The keyed hashes of the fitted stems (``db.passage_signature``); None for a keyring stand-in without a
        master key (it cannot read the memory)."""
        keyring = self.keyring_of()
        if self._key is None and has_master_key(keyring):
            with self._lock:
                self._key = stem_key(signature_key(keyring), shipped_words())
        return self._key

    def fact(self, text: str, key_ids: list[str]) -> dict | None:
        """The remembered output of any of ``key_ids`` whose words are closest to ``text``'s (the text the
        detector tokenized), as the verdict reports it; None when the memory is off, nothing of these keys is
        remembered, the text has no word, or there is no master key."""
        if not self.enabled or not key_ids or not text:
            return None
        key = self.words_key()
        if key is None:
            return None
        copies = [(key_id, copy) for key_id in key_ids if (copy := self.mirror.view(key_id, key)) is not None]
        if not any(len(copy) for _, copy in copies):
            return None  # nothing remembered under these keys (or still loading)
        query = text_signature(text, shipped_words(), key)
        if not len(query.hashes):
            return None
        found, searched, inexact = [], 0, []
        for key_id, copy in copies:
            scored = copy.best(query, CANDIDATES)
            searched += scored.searched
            rows = list(zip(scored.ids.tolist(), scored.similarities.tolist()))
            (found if scored.exact else inexact).extend((similarity, row, key_id) for row, similarity in rows)
        found += self._rescored(query, inexact, key)
        similarity, row, key_id = max(found, default=(0.0, None, None))
        similarity = min(1.0, max(0.0, similarity))
        matched = row is not None and similarity >= self.null.threshold
        receipt = self.mirror.memory.receipt_of(row) if matched else None
        return {"matched": matched and receipt is not None, "receipt_id": receipt,
                "key_id": key_id if matched else None, "similarity": round(similarity, 4),
                "false_match_rate": _rounded(self.null.false_match_rate(similarity, searched)),
                "other_output_rate": _rounded(self.null.false_match_rate(similarity, searched, ("outputs",))),
                "threshold": self.null.threshold, "outputs_searched": searched}

    def _rescored(self, query, candidates: list, key: StemKey) -> list:
        """(exact words similarity, row, key id) of candidates a lookup ranked by part of the text's stems, from
        their stored signatures (rows gone meanwhile are left out)."""
        if not candidates:
            return []
        stored = self.mirror.memory.signatures_of([row for _, row, _ in candidates])
        return [(words_similarity(query, parse(stored[row], key)), row, key_id)
                for _, row, key_id in candidates if row in stored]


def _rounded(rate: float) -> float:
    """Two significant digits, rounded up (a rate shown is never below the one computed)."""
    if rate <= 0.0 or rate >= 1.0:
        return min(1.0, max(0.0, rate))
    exponent = math.floor(math.log10(rate)) - 1
    return math.ceil(rate / 10.0**exponent) * 10.0**exponent
