"""Beside the watermark, the service's memory of its own outputs as two more layers of a robustness run.

A service that remembers what it wrote recognises an attacked text three ways: the watermark (z at the run's
empirical thresholds), the 5-gram match (``db.output_grams``, ``matches_own_output``: at least MIN_MATCHED of its
sampled 5-grams are the source output's alone) and the semantic match (``paraphrase_of_own_output``: the source
is the remembered output whose words are closest, at a words similarity whose false-match rates against the
memory, on human text and on unrelated outputs, from the shipped calibration ``detector.paraphrase_match``, are
at most f; ``evaluation.paraphrase_words``). The memory is the run's clean
outputs of the scheme (n of them); each attacked text counts only when it is recognised as its own source.

Per cell, ``own_output_layers``: for each false-match rate f of ``FMRS``, the fraction recognised by the
watermark alone, by the 5-gram match, by the semantic match, and by any of them; the semantic threshold used and
the quartiles of each attacked text's words similarity to its source.
"""

from __future__ import annotations

import numpy as np

from db.output_grams import GramIndex, output_grams
from detector.normalize import normalize
from detector.paraphrase_match import ParaphraseNull, shipped_null
from evaluation.paraphrase_words import best_of, signatures, word_similarities
from watermark.vocab import encode

FMRS = (1e-3, 1e-4)
GRAM_KEY = 0x5EC0_0D5E  # the run's n-gram hash key (the service derives its own from the master key)


class OwnOutputLayers:
    """The memory of one scheme's clean outputs, and ``measure`` of attacked versions of them."""

    def __init__(self, vocab, generations, null: ParaphraseNull | None = None) -> None:
        self.vocab = vocab
        self.null = null if null is not None else shipped_null()
        ids = [self._ids(g.text) for g in generations]
        self.grams = GramIndex()
        for row, (g, text_ids) in enumerate(zip(generations, ids)):
            self.grams.add(row, output_grams(text_ids, g.prompt_ids, GRAM_KEY))
        self.memory_words = signatures(vocab, ids)
        self.thresholds = {f"{f:g}": self.threshold(f, len(generations)) for f in FMRS}

    def _ids(self, text: str) -> list[int]:
        return encode(self.vocab, normalize(text).text)

    def threshold(self, fmr: float, searched: int) -> float | None:
        """The lowest similarity of the calibration's grid whose false-match rates against ``searched`` outputs, on
        human text and on unrelated outputs of the model, are both at most ``fmr`` (None: none is)."""
        for s in self.null.grid:
            if self.null.false_match_rate(s, searched, ("human", "outputs")) <= fmr:
                return float(s)
        return None

    def measure(self, attacked: list[str], z: list, z_thresholds: dict) -> dict:
        """The layers' recognition rates on ``attacked`` (text i an attacked version of output i), with the
        watermark decided at ``z_thresholds`` (f -> empirical z threshold of the cell's negatives)."""
        ids = [self._ids(t) for t in attacked]
        rows = np.arange(len(attacked))
        gram_hits = np.array([(m := self.grams.match_ids(np.asarray(i, dtype=np.int64), GRAM_KEY)) is not None
                              and m.matches and m.row == r for r, i in zip(rows, ids)], dtype=bool)
        words = word_similarities(signatures(self.vocab, ids), self.memory_words)
        best, column = best_of(words)
        own = words[rows, rows]
        nearest_is_own = column == rows
        out = {"n": len(attacked), "five_gram": float(gram_hits.mean()) if len(rows) else None,
               "similarity_to_source": {q: float(np.quantile(own, float(q))) for q in ("0.25", "0.5", "0.75")}
               if len(rows) else None, "at_fmr": {}}
        for key, threshold in self.thresholds.items():
            semantic = nearest_is_own & (best >= threshold) if threshold is not None else np.zeros(len(rows), bool)
            z_threshold = z_thresholds.get(key)
            watermark = np.array([v is not None and z_threshold is not None and v >= z_threshold for v in z], bool)
            out["at_fmr"][key] = {"semantic_threshold": threshold, "watermark": _mean(watermark),
                                  "five_gram": _mean(gram_hits), "semantic": _mean(semantic),
                                  "any": _mean(watermark | gram_hits | semantic)}
        return out


def _mean(flags: np.ndarray) -> float | None:
    return float(flags.mean()) if flags.shape[0] else None
