"""A remembered output's words as keyed stem hashes: what ``paraphrase_of_own_output`` compares exactly.

The signature is what the semantic memory keeps of an output and compares a text with: the text's word stems
(``db.passage_words.stems``) whose inverse document frequency is at least MIN_IDF (the commonest stems, "the",
"and", carry little and are what a count of hashes would give away first), each as a 32-bit hash under a key the
keyring's master key derives (SIGNATURE_PURPOSE, the same in every replica), with its count (at most
``passage_words.COUNT_CAP``, which is 1; rows written when it was 3 read as 1). No text and no weight is stored:
a stem's weight is looked up when two signatures are compared, from the keyed hashes of the fitted stems
(``StemKey.idf``).

``similarity`` is the cosine of two signatures' TF-IDF vectors (1 + log count, times the stem's inverse document
frequency; with each stem counted once, its inverse document frequency), exact: what the semantic match decides
on (``detector.paraphrase_match``).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np

from db import passage_words
from db.passage_words import COUNT_CAP, Words, fitted_words, stem_counts

SIGNATURE_PURPOSE = b"provmark/semantic-memory-stems"  # the master-key derivation label of the hashes' key
MIN_IDF = 3.0  # stems in more than about one document in seven are left out (docs/research/semantic-memory.md)
HASH = np.dtype("<u4")
COUNT = np.dtype("u1")


@dataclass(frozen=True)
class StemKey:
    """The hashes' key and, per fitted stem, its hash's inverse document frequency (sorted hashes, their idf),
    the weight of a stem not among them, and per row of the fitted stems (``Words.index``) its hash, whether it
    is kept (inverse document frequency at least MIN_IDF) and the inverse document frequency its hash is read
    with (``idf_of``: two stems of one hash read as one)."""

    key: bytes
    hashes: np.ndarray
    idf: np.ndarray
    unseen_idf: float
    row_hashes: np.ndarray
    row_kept: np.ndarray
    row_idf: np.ndarray

    def hash(self, stem: str) -> int:
        return _hash(self.key, stem)

    def weights(self, hashes: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(1 + log count) times each hash's inverse document frequency, float64."""
        return _tf(counts) * idf_of(self.hashes, self.idf, self.unseen_idf, hashes)


def idf_of(fitted: np.ndarray, idf: np.ndarray, unseen_idf: float, hashes: np.ndarray) -> np.ndarray:
    """The inverse document frequency of each of ``hashes``: that of the fitted hash equal to it (``fitted``
    sorted, ``idf`` theirs), else ``unseen_idf``; float64."""
    at = np.minimum(np.searchsorted(fitted, hashes), max(len(fitted) - 1, 0))
    known = (fitted[at] == hashes) if len(fitted) else np.zeros(len(hashes), bool)
    return np.where(known, idf[at] if len(idf) else 0.0, unseen_idf)


def _tf(counts: np.ndarray) -> np.ndarray:
    """1 + log count, a count read at most COUNT_CAP (and at least 1)."""
    return 1.0 + np.log(np.clip(counts, 1, COUNT_CAP).astype(np.float64))


@functools.lru_cache(maxsize=1 << 16)
def _hash(key: bytes, stem: str) -> int:
    return int.from_bytes(hashlib.blake2b(stem.encode("utf-8", "surrogatepass"), digest_size=4, key=key).digest(),
                          "little")


@functools.lru_cache(maxsize=8)
def stem_key(key: bytes, words: Words) -> StemKey:
    """The fitted stems of ``words`` hashed under ``key`` (about 0.1 s for 30,000 stems, once per key)."""
    rows = np.fromiter(words.index.values(), dtype=np.int64, count=len(words.index))
    hashes = np.fromiter((_hash(key, stem) for stem in words.index), dtype=HASH, count=len(words.index))
    row_hashes = np.zeros(len(words.idf), dtype=HASH)
    row_hashes[rows] = hashes
    order = np.argsort(hashes, kind="stable")
    hashes, idf = hashes[order], words.idf[rows][order].astype(np.float64)
    unseen = float(words.unseen_idf)
    return StemKey(key, hashes, idf, unseen, row_hashes, np.asarray(words.idf, dtype=np.float64) >= MIN_IDF,
                   idf_of(hashes, idf, unseen, row_hashes))


@functools.cache
def shipped_words() -> Words:
    """The fitted stems shipped with the package (``db.passage_words.fitted_words``), one object per process
    (``stem_key`` caches by it): what both services read signatures with."""
    return fitted_words()


def warm_up() -> Words:
    """The shipped stems, and what reading a text's stems with them needs (``passage_words.warm_up``), made now."""
    words = shipped_words()
    passage_words.warm_up(words)
    return words


def signature_key(keyring) -> bytes:
    """The hashes' 32-byte key, derived from ``keyring``'s master key (the same in every worker and replica)."""
    return keyring.derive_key(SIGNATURE_PURPOSE)


def _read(text: str, words: Words, key: StemKey) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``text``'s stems of inverse document frequency at least MIN_IDF as (sorted unique keyed hashes, their
    counts, their inverse document frequencies, as ``StemKey.weights`` reads them); two stems of one hash count
    together."""
    rows, counts, others = stem_counts(text, words, key.row_kept)
    hashes, idf = key.row_hashes[rows], key.row_idf[rows]
    if others and key.unseen_idf >= MIN_IDF:  # stems the fit never saw: hashed one by one (cached)
        unseen = collections.Counter(others)
        more = np.fromiter((key.hash(stem) for stem in unseen), dtype=HASH, count=len(unseen))
        hashes = np.concatenate([hashes, more])
        counts = np.concatenate([counts, np.fromiter(unseen.values(), dtype=np.int64, count=len(unseen))])
        idf = np.concatenate([idf, idf_of(key.hashes, key.idf, key.unseen_idf, more)])
    order = np.argsort(hashes, kind="stable")
    hashes, counts, idf = hashes[order], counts[order], idf[order]
    if hashes.shape[0] > 1 and (hashes[1:] == hashes[:-1]).any():  # two stems of one hash (rare): one count
        hashes, first, at = np.unique(hashes, return_index=True, return_inverse=True)
        counts = np.bincount(at, weights=counts, minlength=len(hashes)).astype(np.int64)
        idf = idf[first]
    return hashes.astype(HASH), counts, idf


def counted(text: str, words: Words, key: StemKey) -> tuple[np.ndarray, np.ndarray]:
    """``text``'s stems of inverse document frequency at least MIN_IDF as (sorted unique keyed hashes, their
    counts, at most COUNT_CAP; two stems of one hash count together)."""
    hashes, counts, _ = _read(text, words, key)
    return hashes, np.minimum(counts, COUNT_CAP).astype(COUNT)


def signature(text: str, words: Words, key: StemKey) -> bytes:
    """What the memory stores of ``text``'s words: its stems of inverse document frequency at least MIN_IDF, as
    sorted unique 32-bit keyed hashes, then one count byte each (b"" for a text with none)."""
    hashes, counts = counted(text, words, key)
    return hashes.tobytes() + counts.tobytes() if len(hashes) else b""


@dataclass(frozen=True)
class Parsed:
    """A signature read back: sorted hashes, their unit-length weights, and the factor that made them unit length
    (one over the TF-IDF vector's norm; 1 for an empty one). With each stem counted once a weight is the stem's
    inverse document frequency times ``scale``, which the inverted index uses (``db.signature_index``)."""

    hashes: np.ndarray
    weights: np.ndarray
    scale: float = 1.0


def parse(blob: bytes, key: StemKey) -> Parsed:
    """A stored signature's hashes and unit weights; a malformed blob reads as empty."""
    size = HASH.itemsize + COUNT.itemsize
    if not blob or len(blob) % size:
        return Parsed(np.zeros(0, HASH), np.zeros(0))
    n = len(blob) // size
    return parsed(np.frombuffer(blob, dtype=HASH, count=n), np.frombuffer(blob, dtype=COUNT, count=n,
                                                                          offset=n * HASH.itemsize), key)


def parsed(hashes: np.ndarray, counts: np.ndarray, key: StemKey) -> Parsed:
    """Sorted unique hashes and their counts (read at most COUNT_CAP), with unit weights."""
    return _unit(hashes, key.weights(hashes, counts))


def _unit(hashes: np.ndarray, weights: np.ndarray) -> Parsed:
    norm = math.sqrt(float(weights @ weights))
    return Parsed(hashes, weights / norm, 1.0 / norm) if norm > 0 else Parsed(hashes, weights)


def text_signature(text: str, words: Words, key: StemKey) -> Parsed:
    """``parse(signature(text, words, key), key)``, without the bytes: what a verdict compares."""
    hashes, counts, idf = _read(text, words, key)
    return _unit(hashes, idf if COUNT_CAP == 1 else _tf(counts) * idf)  # counted once: the weight is the idf


def similarity(a: Parsed, b: Parsed) -> float:
    """The cosine of two signatures' TF-IDF vectors (0 when either is empty)."""
    _, at_a, at_b = np.intersect1d(a.hashes, b.hashes, assume_unique=True, return_indices=True)
    return float(a.weights[at_a] @ b.weights[at_b])


def text_signature_bytes(text: str, key: bytes) -> bytes:
    """``signature`` of ``text`` with the shipped stems under the hashes' ``key`` (``signature_key``): what the
    generation service stores of an output, from the text the detector will read it as."""
    words = shipped_words()
    return signature(text, words, stem_key(key, words))
