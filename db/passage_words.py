"""The words part of a passage vector (``db.passage_vectors``): a text's word stems as a TF-IDF count sketch.

A stem is a lower-cased word (``\\w+``, any script) cut to its first STEM_CHARS characters, a crude stemmer
that makes one stem of a word's inflections ("announced", "announces") at the price of a few unrelated words
sharing one ("universe", "university"). Each stem weighs 1 + log(its count in the text, at most COUNT_CAP)
times its inverse document frequency, fitted on human text and on the model's own outputs
(``stem_frequencies``): a stem seen in fewer than MIN_DOCUMENTS of those documents is not kept and weighs as
the rarest (``Words.unseen_idf``). The
weighted stems are added into ``dim`` coordinates by a count sketch: each stem goes to SKETCH_BUCKETS
coordinates with signs, both drawn from a BLAKE2b hash of the stem under the public SKETCH_KEY, so any stem,
seen in the fit or not, has its place, and the cosine of two sketches estimates the cosine of the two TF-IDF
vectors. Nothing here is secret: the stored vector's keyed rotation comes after (``db.passage_vectors``).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

STEM_CHARS = 6  # a stem is a word's first 6 characters
STEM = re.compile(r"(\w{1,%d})\w*" % STEM_CHARS)  # a word, capturing its stem
SKETCH_BUCKETS = 4  # signed coordinates per stem
SKETCH_KEY = b"provmark/word-sketch"  # public: the sketch needs no secret
MIN_DOCUMENTS = 2  # a stem in fewer fitted documents weighs as one never seen
# a stem counts at most this often: an output that repeats one word a hundred times (a degenerate loop) is not made
# of that word, and two such loops on one word were the closest unrelated outputs (docs/research/semantic-memory.md)
COUNT_CAP = 3


def stems(text: str) -> list[str]:
    """The text's word stems, in order."""
    return STEM.findall(text.lower())


@functools.lru_cache(maxsize=1 << 16)
def stem_sketch(stem: str, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(SKETCH_BUCKETS coordinates in [0, dim) int64, their signs divided by sqrt(SKETCH_BUCKETS) float32)."""
    digest = hashlib.blake2b(stem.encode("utf-8", "surrogatepass"), digest_size=3 * SKETCH_BUCKETS,
                             key=SKETCH_KEY).digest()
    buckets = np.array([int.from_bytes(digest[2 * b:2 * b + 2], "little") % dim for b in range(SKETCH_BUCKETS)],
                       dtype=np.int64)
    signs = np.array([1.0 if digest[2 * SKETCH_BUCKETS + b] & 1 else -1.0 for b in range(SKETCH_BUCKETS)],
                     dtype=np.float32) / np.float32(math.sqrt(SKETCH_BUCKETS))
    return buckets, signs


@dataclass(frozen=True, eq=False)
class Words:
    """The fitted stems: each one's row (``index``), its coordinates [S, B] and signed weights [S, B] (sign /
    sqrt(B) times its inverse document frequency), the weight of a stem not among them, and each one's inverse
    document frequency [S]."""

    index: dict[str, int]
    buckets: np.ndarray
    weights: np.ndarray
    unseen_idf: float
    idf: np.ndarray
    @classmethod
    def fitted(cls, fitted_stems: Iterable[str], idf: np.ndarray, unseen_idf: float, dim: int) -> Words:
        fitted_stems = [str(s) for s in fitted_stems]
        buckets = np.zeros((len(fitted_stems), SKETCH_BUCKETS), dtype=np.int64)
        weights = np.zeros((len(fitted_stems), SKETCH_BUCKETS), dtype=np.float32)
        for row, stem in enumerate(fitted_stems):
            buckets[row], signs = stem_sketch(stem, dim)
            weights[row] = signs * np.float32(idf[row])
        return cls({stem: row for row, stem in enumerate(fitted_stems)}, buckets, weights, float(unseen_idf),
                   np.asarray(idf, dtype=np.float32))


def words_part(text: str, words: Words, dim: int) -> np.ndarray:
    """The text's words part [dim] float32 (not normalised; zero for a text without words)."""
    counted = collections.Counter(stems(text))
    if not counted:
        return np.zeros(dim, dtype=np.float32)
    found = list(counted)
    rows = np.fromiter(map(words.index.get, found, itertools.repeat(-1)), dtype=np.int64, count=len(found))
    counts = np.fromiter(counted.values(), dtype=np.float64, count=len(found))
    tf = 1.0 + np.log(np.minimum(counts, COUNT_CAP))
    known = rows >= 0
    at = rows[known]
    out = np.bincount(words.buckets[at].ravel(), weights=(words.weights[at] * tf[known, None]).ravel(),
                      minlength=dim).astype(np.float64)  # float even when no stem is known
    unknown = np.flatnonzero(~known)
    if unknown.shape[0]:  # stems the fit never saw: their sketches made (and cached) one by one, added at once
        sketched = [stem_sketch(found[k], dim) for k in unknown]
        out += np.bincount(np.concatenate([b for b, _ in sketched]), minlength=dim,
                           weights=np.concatenate([s * (tf[k] * words.unseen_idf) for (_, s), k in zip(sketched, unknown)]))
    return out.astype(np.float32)


def stem_frequencies(documents: Iterable[Iterable[str]]) -> tuple[np.ndarray, np.ndarray, float]:
    """(The stems in at least MIN_DOCUMENTS of ``documents`` (each a text's stems), sorted; their inverse
    document frequency log((n + 1) / (df + 1)) + 1 float32; that of a stem in no document)."""
    df: collections.Counter = collections.Counter()
    count = 0
    for document in documents:
        df.update(set(document))
        count += 1
    kept = sorted(stem for stem, n in df.items() if n >= MIN_DOCUMENTS)
    idf = np.array([math.log((count + 1) / (df[stem] + 1)) + 1 for stem in kept], dtype=np.float32)
    return np.array(kept, dtype=str), idf, math.log(count + 1) + 1
