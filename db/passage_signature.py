"""A remembered output's words as keyed stem hashes: what ``paraphrase_of_own_output`` compares exactly.

The passage vector (``db.passage_vectors``) finds the outputs nearest a text; its words part is a count sketch,
whose noise (about one over the square root of its 384 coordinates) lifts the highest similarity unrelated texts
reach, and with it the threshold. The signature holds the same words without the noise: the text's word stems
(``db.passage_words.stems``) whose inverse document frequency is at least MIN_IDF (the commonest stems, "the",
"and", carry little and are what a count of hashes would give away first), each as a 32-bit hash under a key the
keyring's master key derives (SIGNATURE_PURPOSE, the same in every replica), with its count (at most
``passage_words.COUNT_CAP``). No text and no weight is stored: a stem's weight is looked up when two signatures are
compared, from the keyed hashes of the fitted stems (``StemKey.idf``).

``similarity`` is the cosine of two signatures' TF-IDF vectors (1 + log count, times the stem's inverse document
frequency), exact: what the semantic match decides on (``detector.paraphrase_match``).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from db.passage_words import COUNT_CAP, Words, stems

SIGNATURE_PURPOSE = b"provmark/semantic-memory-stems"  # the master-key derivation label of the hashes' key
MIN_IDF = 3.0  # stems in more than about one document in seven are left out (docs/research/semantic-memory.md)
HASH = np.dtype("<u4")
COUNT = np.dtype("u1")


@dataclass(frozen=True)
class StemKey:
    """The hashes' key and, per fitted stem, its hash's inverse document frequency (sorted hashes, their idf),
    and the weight of a stem not among them."""

    key: bytes
    hashes: np.ndarray
    idf: np.ndarray
    unseen_idf: float

    def hash(self, stem: str) -> int:
        return _hash(self.key, stem)

    def weights(self, hashes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(1 + log count) times each hash's inverse document frequency, float64."""
        at = np.minimum(np.searchsorted(self.hashes, hashes), max(len(self.hashes) - 1, 0))
        known = (self.hashes[at] == hashes) if len(self.hashes) else np.zeros(len(hashes), bool)
        idf = np.where(known, self.idf[at] if len(self.idf) else 0.0, self.unseen_idf)
        return (1.0 + np.log(counts.astype(np.float64))) * idf


@functools.lru_cache(maxsize=1 << 16)
def _hash(key: bytes, stem: str) -> int:
    return int.from_bytes(hashlib.blake2b(stem.encode("utf-8", "surrogatepass"), digest_size=4, key=key).digest(),
                          "little")


@functools.lru_cache(maxsize=8)
def stem_key(key: bytes, words: Words) -> StemKey:
    """The fitted stems of ``words`` hashed under ``key`` (about 0.1 s for 30,000 stems, once per key)."""
    hashes = np.fromiter((_hash(key, stem) for stem in words.index), dtype=HASH, count=len(words.index))
    idf = words.idf[np.fromiter(words.index.values(), dtype=np.int64, count=len(words.index))]
    order = np.argsort(hashes, kind="stable")
    return StemKey(key, hashes[order], idf[order].astype(np.float64), float(words.unseen_idf))


def signature_key(keyring) -> bytes:
    """The hashes' 32-byte key, derived from ``keyring``'s master key (the same in every worker and replica)."""
    return keyring.derive_key(SIGNATURE_PURPOSE)


def signature(text: str, words: Words, key: StemKey) -> bytes:
    """What the memory stores of ``text``'s words: its stems of inverse document frequency at least MIN_IDF, as
    sorted unique 32-bit keyed hashes, then one count byte each (b"" for a text with none)."""
    counted = collections.Counter(stems(text))
    kept: dict[int, int] = {}
    for stem, count in counted.items():
        row = words.index.get(stem)
        if (words.unseen_idf if row is None else float(words.idf[row])) >= MIN_IDF:
            hashed = key.hash(stem)
            kept[hashed] = min(COUNT_CAP, kept.get(hashed, 0) + count)
    if not kept:
        return b""
    hashes = np.array(sorted(kept), dtype=HASH)
    counts = np.array([kept[int(h)] for h in hashes], dtype=COUNT)
    return hashes.tobytes() + counts.tobytes()


@dataclass(frozen=True)
class Parsed:
    """A signature read back: sorted hashes, and their unit-length weights."""

    hashes: np.ndarray
    weights: np.ndarray


def parse(blob: bytes, key: StemKey) -> Parsed:
    """A stored signature's hashes and unit weights; a malformed blob reads as empty."""
    size = HASH.itemsize + COUNT.itemsize
    if not blob or len(blob) % size:
        return Parsed(np.zeros(0, HASH), np.zeros(0))
    n = len(blob) // size
    hashes = np.frombuffer(blob, dtype=HASH, count=n)
    counts = np.frombuffer(blob, dtype=COUNT, count=n, offset=n * HASH.itemsize)
    weights = key.weights(hashes, np.maximum(counts, 1))
    norm = math.sqrt(float(weights @ weights))
    return Parsed(hashes, weights / norm if norm > 0 else weights)


def similarity(a: Parsed, b: Parsed) -> float:
    """The cosine of two signatures' TF-IDF vectors (0 when either is empty)."""
    _, at_a, at_b = np.intersect1d(a.hashes, b.hashes, assume_unique=True, return_indices=True)
    return float(a.weights[at_a] @ b.weights[at_b])


def ids_signature(token_ids, space, key: bytes) -> bytes:
    """``signature`` of the text of ``token_ids`` as the memory reads it (``space``: ``db.passage_vectors.Space``,
    whose decoder and fitted stems both services share), under the hashes' ``key`` (``signature_key``)."""
    return signature(space.decode([int(i) for i in token_ids]), space.words, stem_key(key, space.words))
