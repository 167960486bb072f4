"""``paraphrase_of_own_output``: does a text restate, in other words, one output the service remembers?

The watermark and the 5-gram match (``db.output_grams``) read the tokens; a paraphrase replaces them. The
semantic memory (``db.semantic_memory``) keeps, per output, a passage vector (``db.passage_vectors``) and its
words' signature (``db.passage_signature``). A verdict asks each tested key's copy (``VectorMirror``, this
process's approximate-nearest-neighbour index) for the CANDIDATES outputs nearest the text's passage vector, reads
the signatures of those at the GATE or above from the store, and names the one whose words are closest (an exact
cosine: the vector's sketch of the words is noisy, and its noise raised the highest similarity unrelated texts
reach). The fact it adds: that words similarity, the false-match rate it carries, whether it clears the calibrated
threshold, and then that output's receipt id. It never changes the watermark verdict. A text whose nearest outputs
are all below the gate (most texts that restate nothing) costs no store read and has no words similarity.

The false-match rate comes from the calibration shipped beside this module (``data/paraphrase_null.json``, made by
``python -m evaluation.paraphrase_calibration``): per pair (one text, one unrelated remembered output), how often
human text and other outputs of the same model reach a words similarity, on the fit half of the human corpora
(``detector.human_corpora``) and of the model's outputs (``ParaphraseNull.pair_rate``). A text searched against
``n`` outputs is falsely matched with probability at most ``n`` times that pair rate (a union bound, no
independence assumed): ``false_match_rate`` for human text, ``other_output_rate`` for an unrelated output of the
model (the named receipt would be the wrong one). The threshold (``matched``: not a text nobody generated) is one
grid step above the highest words similarity any fit human passage or fit output reached through the two stages,
checked on the held-out half (docs/detection.md, "Paraphrases of our own output").
"""

from __future__ import annotations

import bisect
import json
import math
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from db.passage_signature import StemKey, ids_signature, parse, signature_key, stem_key
from db.passage_signature import similarity as words_similarity
from db.passage_vectors import rotation_seed, stored_vector, vocab_table
from detector.key_source import has_master_key

NULL_FILE = Path(__file__).with_name("data") / "paraphrase_null.json"
# candidates: the nearest outputs per key the passage vectors' index returns; gate: the lowest passage-vector
# similarity whose words are compared (held-out human passages reach it against 10^4 outputs about 6 % of the time,
# the paraphrases the words confirm nearly always: docs/research/semantic-memory.md)
CANDIDATES = 16
GATE = 0.25
FIELD_DESCRIPTION = (  # the verdict field's description in the HTTP API (api/detector/schemas.py)
    "keyed verdicts where the service keeps its outputs' meaning (PROVMARK_SEMANTIC_OUTPUTS): matched, the text "
    "restates one remembered output of a tested key in other words (among the outputs nearest its passage vector, "
    "the one whose words are closest, at a words similarity at or above the calibrated threshold); it never changes "
    "the verdict. The detect scope sees matched only; explain and admin also similarity (the words similarity; null "
    "when no nearby output was close enough to compare), vector_similarity (the nearest passage vector's cosine), "
    "the false-match rate the similarity carries against the outputs searched (how often human text reaches it), "
    "other_output_rate (how often an unrelated output of the model does: a wrong receipt), the threshold, and for a "
    "match the output's receipt_id and key_id. None when no tested key has remembered outputs")


@dataclass(frozen=True)
class ParaphraseNull:
    """Pair exceedances on a similarity grid: ``rate(s)`` is the larger of the nulls' (k + 1) / (pairs + 1),
    k the pairs at or above s (an upper estimate that is never 0)."""

    grid: tuple[float, ...]  # ascending similarities
    nulls: dict  # name -> {"pairs": P, "texts": N, "outputs": M, "exceed": [k per grid point]}
    threshold: float
    source: str = ""
    gate: float = GATE  # the passage-vector similarity a candidate needs for its words to be compared
    candidates: int = CANDIDATES  # nearest outputs per key taken from the passage vectors' index

    @classmethod
    def from_dict(cls, data: dict) -> ParaphraseNull:
        grid = tuple(float(s) for s in data["grid"])
        if list(grid) != sorted(grid) or not grid:
            raise ValueError("paraphrase null: the grid must be a non-empty ascending list")
        for name, null in data["nulls"].items():
            if len(null["exceed"]) != len(grid):
                raise ValueError(f"paraphrase null {name!r}: one exceedance count per grid point expected")
        return cls(grid, dict(data["nulls"]), float(data["threshold"]), data.get("source", ""),
                   float(data.get("gate", GATE)), int(data.get("candidates", CANDIDATES)))

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


@cache
def shipped_null() -> ParaphraseNull:
    """The calibration shipped with the package (``NULL_FILE``)."""
    return ParaphraseNull.from_dict(json.loads(NULL_FILE.read_text()))


class ParaphraseMatcher:
    """The ``paraphrase_of_own_output`` fact of a text under the tested keys, from a ``VectorMirror``."""

    def __init__(self, mirror, keyring_of, null: ParaphraseNull | None = None) -> None:
        """``keyring_of``: returns the keyring (the detector's, made on first use)."""
        self.mirror = mirror
        self.keyring_of = keyring_of
        self.null = null if null is not None else shipped_null()
        self._seed: bytes | None = None
        self._signature_key: bytes | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.mirror is not None and self.mirror.enabled

    def seed(self) -> bytes | None:
        """The stored vectors' rotation seed (``db.passage_vectors.rotation_seed``); None for a keyring stand-in
        without a master key (it cannot read the memory)."""
        keyring = self.keyring_of()
        if self._seed is None and has_master_key(keyring):
            with self._lock:
                self._seed = rotation_seed(keyring)
        return self._seed

    def vector(self, token_ids, vocab) -> np.ndarray | None:
        """The text's stored-form vector (int8) from the token ids the detector read it as."""
        seed = self.seed()
        if seed is None:
            return None
        return stored_vector(token_ids, vocab_table(vocab), seed)

    def words_key(self, space) -> StemKey | None:
        """The keyed hashes of the fitted stems (``db.passage_signature``); None without a master key."""
        keyring = self.keyring_of()
        if self._signature_key is None and has_master_key(keyring):
            with self._lock:
                self._signature_key = signature_key(keyring)
        return None if self._signature_key is None else stem_key(self._signature_key, space.words)

    def fact(self, token_ids, vocab, key_ids: list[str]) -> dict | None:
        """The remembered output of any of ``key_ids`` whose words are closest to the text's, among the
        ``candidates`` nearest in the passage vectors' index of each key (those at ``gate`` or above), as the verdict
        reports it; None when the memory is off, nothing of these keys is remembered, or no master key."""
        if not self.enabled or not key_ids or len(token_ids) == 0:
            return None
        copies = [(key_id, copy) for key_id in key_ids if (copy := self.mirror.view(key_id)) is not None]
        if not any(len(copy) for _, copy in copies):
            return None  # nothing remembered under these keys (or still loading): no vector to compute
        vector = self.vector(token_ids, vocab)
        if vector is None or not vector.any():
            return None
        found, searched = [], 0
        for key_id, copy in copies:
            near = copy.candidates(vector, self.null.candidates)
            searched += near[0].searched if near else 0
            found += [(candidate, key_id) for candidate in near]
        if not found:
            return None
        nearest = max(candidate.similarity for candidate, _ in found)
        best = self._confirmed([pair for pair in found if pair[0].similarity >= self.null.gate], token_ids, vocab)
        similarity = None if best is None else float(np.clip(best[0], 0.0, 1.0))
        matched = similarity is not None and similarity >= self.null.threshold
        receipt = self.mirror.memory.receipt_of(best[1].row) if matched else None
        rated = 0.0 if similarity is None else similarity
        return {"matched": matched and receipt is not None, "receipt_id": receipt,
                "key_id": best[2] if matched else None,
                "similarity": None if similarity is None else round(similarity, 4),
                "vector_similarity": round(float(np.clip(nearest, -1.0, 1.0)), 4),
                "false_match_rate": _rounded(self.null.false_match_rate(rated, searched)),
                "other_output_rate": _rounded(self.null.false_match_rate(rated, searched, ("outputs",))),
                "threshold": self.null.threshold, "outputs_searched": searched}

    def _confirmed(self, gated: list, token_ids, vocab) -> tuple | None:
        """(words similarity, candidate, key id) of the gated candidate whose stored signature is closest to the
        text's; None when none has one (no candidate at the gate, or rows from before signatures)."""
        if not gated:
            return None
        stored = self.mirror.memory.signatures_of([candidate.row for candidate, _ in gated])
        space = vocab_table(vocab)
        key = self.words_key(space)
        if not stored or key is None:
            return None
        query = parse(ids_signature(token_ids, space, key.key), key)
        scored = [(words_similarity(query, parse(stored[c.row], key)), c, key_id) for c, key_id in gated if c.row in stored]
        return max(scored, key=lambda item: item[0]) if scored else None


def _rounded(rate: float) -> float:
    """Two significant digits, rounded up (a rate shown is never below the one computed)."""
    if rate <= 0.0 or rate >= 1.0:
        return min(1.0, max(0.0, rate))
    exponent = math.floor(math.log10(rate)) - 1
    return math.ceil(rate / 10.0**exponent) * 10.0**exponent
