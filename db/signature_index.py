"""One key's remembered outputs as a detector worker holds them: an inverted index of their words' signatures.

``paraphrase_of_own_output`` decides on the cosine of two signatures' TF-IDF vectors (``db.passage_signature``):
a sum, over the stems two texts share, of the products of their unit weights. An inverted index (per stem hash,
the outputs that have it and their weight there) computes that sum for every remembered output at once, reading
only the postings of the text's own stems: the exact similarity of the text to each output, with no first stage
that could miss the closest one (an approximate-nearest-neighbour index over vectors does, at scale).

The index is a list of ``Segment``s (sorted hashes, each one's postings: the positions of the outputs that have
it; per output, one over its vector's norm), oldest first. Each stem counted once, a stem's unit weight in an
output is the stem's inverse document frequency times that factor, so a posting is 2 bytes (4 in a segment of
more than 65,536 outputs) and carries no weight. New rows (``add``) make a segment; a segment at least half the
size of the one before it is merged into it, so there are about log2(outputs / first segment) segments and each
row is rewritten about as often. Retention keeps the newest ``keep`` row ids, as the store does (``SemanticMemory.prune``): older
rows are left out of every score at once and dropped from the postings at the next merge.

A lookup reads at most MAX_POSTINGS postings: past that (a long text against a million outputs), it leaves out
the text's stems with the longest postings (the commonest among the remembered outputs, which weigh least), and
``Scored.exact`` says so; the caller then compares the best few exactly (``detector.paraphrase_match``).

The look-up of a text's stems and the sum over their postings run in C (``csrc/signature_index.c``: a directory
of the hashes' top bits, then one pass over the postings: 0.11 ms for a 1,000-token text's 175,000 postings among
20,000 outputs in a loop, 0.26 ms with the caches emptied before each, as the rest of a verdict leaves them),
built once with the system compiler and cached like the other native kernels
(``watermark.native_build``); without a compiler, or with ``PROVMARK_NATIVE=0``, numpy gives the same
similarities (to float32 rounding) in about four times as long.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from db.passage_signature import Parsed
from db.passage_words import COUNT_CAP
from watermark.native_build import address, optional_c_library

SOURCE = Path(__file__).with_name("csrc") / "signature_index.c"

MAX_POSTINGS = 2_000_000  # postings one lookup reads (per key); past it the commonest stems are left out
NARROW_ROWS = 1 << 16  # a segment of at most this many outputs stores a posting in 2 bytes, a larger one in 4
WEIGHT = np.float32
if COUNT_CAP != 1:  # a posting carries no weight: a stem's weight in an output is its idf times the output's scale
    raise ImportError(f"db.signature_index needs each stem counted once (passage_words.COUNT_CAP = {COUNT_CAP})")


@functools.cache
def _library():
    pointer, size, int64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    arguments = [pointer, pointer, size, pointer, pointer, ctypes.c_int, pointer, pointer, pointer, size, int64,
                 pointer, pointer]
    return optional_c_library(SOURCE, ("-O2", "-shared", "-fPIC"), "signature_index", "numpy", {
        "signature_scores": (arguments, int64), "signature_scores16": (arguments, int64)})


def directory_bits(hashes: int) -> int:
    """Bits of the hash that index a segment's directory: about four hashes per bucket."""
    return min(24, (hashes // 4).bit_length())


@dataclass(frozen=True)
class Segment:
    """Rows (``ids``: row ids, ascending; ``scales``: one over each row's TF-IDF norm) and their postings: per
    sorted unique hash, ``rows[starts[i]:starts[i+1]]`` (positions in ``ids``, ascending). With each stem counted
    once, a stem's unit weight in a row is its inverse document frequency times the row's scale, so a posting
    needs no weight of its own. ``directory[b]`` is where the hashes whose top ``bits`` bits are b begin."""

    ids: np.ndarray
    scales: np.ndarray
    hashes: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    directory: np.ndarray
    bits: int

    @classmethod
    def of(cls, ids: np.ndarray, scales: np.ndarray, hashes: np.ndarray, rows: np.ndarray) -> Segment:
        """From postings (hash, row) in any order: ``rows`` index ``ids`` and ``scales`` (which need not be
        sorted)."""
        order = np.argsort(ids, kind="stable")
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        rows = position[rows] if len(rows) else rows.astype(np.int64)
        by_hash = np.argsort(hashes, kind="stable")
        unique, starts = np.unique(hashes[by_hash], return_index=True)
        bits = directory_bits(len(unique))
        bounds = np.arange((1 << bits) + 1, dtype=np.uint64) << np.uint64(32 - bits)
        return cls(ids[order].astype(np.int64), scales[order].astype(WEIGHT), unique.astype(np.uint32),
                   np.append(starts, len(hashes)).astype(np.int64),
                   rows[by_hash].astype(np.uint16 if len(ids) <= NARROW_ROWS else np.int32),
                   np.searchsorted(unique.astype(np.uint64), bounds).astype(np.uint32), bits)

    @classmethod
    def build(cls, ids: list[int], parsed: list[Parsed]) -> Segment:
        lengths = np.fromiter((len(p.hashes) for p in parsed), dtype=np.int64, count=len(parsed))
        hashes = np.concatenate([p.hashes for p in parsed]) if parsed else np.zeros(0, np.uint32)
        scales = np.fromiter((p.scale for p in parsed), dtype=np.float64, count=len(parsed))
        rows = np.repeat(np.arange(len(parsed)), lengths)
        return cls.of(np.asarray(ids, dtype=np.int64), scales, hashes, rows)

    def merged(self, newer: Segment, below: int) -> Segment:
        """This segment and ``newer`` as one, rows with ids below ``below`` left out."""
        parts = []
        offset = 0
        for segment in (self, newer):
            rows = segment.rows.astype(np.int64)
            live = segment.ids[rows] >= below
            parts.append((np.repeat(segment.hashes, np.diff(segment.starts))[live], rows[live] + offset))
            offset += len(segment.ids)
        ids = np.concatenate([self.ids, newer.ids])
        kept = ids >= below
        renumber = np.cumsum(kept) - 1
        hashes, rows = (np.concatenate(column) for column in zip(*parts))
        return Segment.of(ids[kept], np.concatenate([self.scales, newer.scales])[kept], hashes, renumber[rows])

    @property
    def size(self) -> int:
        return len(self.rows)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.ids, self.scales, self.hashes, self.starts, self.rows, self.directory))


def segment_scores(segment: Segment, hashes: np.ndarray, products: np.ndarray, budget: int,
                   native: bool = True) -> tuple[np.ndarray | None, int, bool]:
    """(Per row of ``segment``, float32, its scale times the sum of ``products`` (per stem of the text, sorted
    ``hashes``: its unit weight times its inverse document frequency) over the text's stems it has; the postings
    read; whether those are all the text's stems have there). Past ``budget`` postings only the stems with the
    shortest postings are read, within it; None when none is read."""
    out = np.zeros(len(segment.ids), dtype=WEIGHT)
    library = _library() if native else None
    if library is not None:
        kernel = library.signature_scores16 if segment.rows.dtype == np.uint16 else library.signature_scores
        found = np.empty(len(hashes), dtype=np.int64)
        total = kernel(address(hashes), address(products), len(hashes), address(segment.hashes),
                       address(segment.directory), segment.bits, address(segment.starts), address(segment.rows),
                       address(segment.scales), len(segment.ids), budget, address(found), address(out))
        if total <= budget:
            return (out if total else None), int(total), True
        hit = found >= 0
        at = found[hit]
    else:
        at = np.minimum(np.searchsorted(segment.hashes, hashes), len(segment.hashes) - 1)
        hit = segment.hashes[at] == hashes
        at = at[hit]
    starts, lengths, products = segment.starts[at], segment.starts[at + 1] - segment.starts[at], products[hit]
    exact = int(lengths.sum()) <= budget
    if not exact:  # the stems with the shortest postings, within the budget
        shortest = np.argsort(lengths, kind="stable")
        keep = shortest[np.cumsum(lengths[shortest]) <= budget]
        starts, lengths, products = starts[keep], lengths[keep], products[keep]
    total = int(lengths.sum())
    if not total:
        return None, 0, exact
    if library is not None:  # the chosen stems again, all read this time (arrays held: the kernel reads them)
        chosen, products = np.ascontiguousarray(hashes[hit][keep]), np.ascontiguousarray(products)
        scratch = np.empty(len(chosen), dtype=np.int64)
        kernel(address(chosen), address(products), len(chosen), address(segment.hashes), address(segment.directory),
               segment.bits, address(segment.starts), address(segment.rows), address(segment.scales),
               len(segment.ids), total, address(scratch), address(out))
        return out, total, exact
    flat = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
    summed = np.bincount(segment.rows[flat], minlength=len(segment.ids), weights=np.repeat(products, lengths))
    return (summed * segment.scales).astype(WEIGHT), total, exact


@dataclass(frozen=True)
class Scored:
    """A lookup's best rows: row ids and their similarities (best first), the live rows searched, and whether
    every stem of the text was read (then the similarities are the exact cosines)."""

    ids: np.ndarray
    similarities: np.ndarray
    searched: int
    exact: bool


class SignatureIndex:
    """The newest ``keep`` rows of one key: ``add`` rows (id, parsed signature), ``best`` for a text's."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.segments: list[Segment] = []
        self.below = 0  # rows with smaller ids are past retention
        self.newest = 0
        self.seen: set[int] = set()  # ids within the look-back of ``newest`` already added
        self.live = 0  # rows held within retention (``len``)
        self.synced_at = time.monotonic()
        self._lock = threading.Lock()  # add and best from several threads (gunicorn's threads, the loader)

    def add(self, rows: list[tuple[int, Parsed]], look_back: int = 256) -> None:
        """Add ``rows`` not added before (a row read twice, within ``look_back`` of the newest, is one row)."""
        rows = [(i, p) for i, p in rows if i not in self.seen]
        if not rows:
            return
        segment = Segment.build([i for i, _ in rows], [p for _, p in rows])
        with self._lock:
            segments = [*self.segments, segment]
            self.newest = max(self.newest, int(segment.ids[-1]))
            self.seen = {i for i in self.seen if i > self.newest - look_back} | {
                i for i, _ in rows if i > self.newest - look_back}
            if sum(len(s.ids) for s in segments) > self.keep:  # the keep-th newest id: older ones are past retention
                held = np.concatenate([s.ids for s in segments])
                self.below = int(np.partition(held, len(held) - self.keep)[len(held) - self.keep])
            while len(segments) > 1 and 2 * segments[-1].size >= segments[-2].size:
                segments[-2:] = [segments[-2].merged(segments[-1], self.below)]
            self.segments = [s for s in segments if len(s.ids) and s.ids[-1] >= self.below]
            self.live = int(sum(len(s.ids) - np.searchsorted(s.ids, self.below) for s in self.segments))

    def __len__(self) -> int:
        return self.live

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.segments)

    def oldest(self) -> int | None:
        """The smallest live row id held (None: none)."""
        segments, below = self.segments, self.below
        firsts = [int(s.ids[at]) for s in segments if (at := int(np.searchsorted(s.ids, below))) < len(s.ids)]
        return min(firsts) if firsts else None

    def best(self, query: Parsed, count: int, max_postings: int = MAX_POSTINGS) -> Scored:
        """The live row whose signature is closest to ``query`` when every stem of it was read (``exact``), else
        the ``count`` closest by the stems read; rows sharing no stem with it are never returned."""
        segments, below = self.segments, self.below
        exact = True
        found_ids, found_scores = [], []
        searched = 0
        budget = max_postings
        scored = []  # per segment: (its ids, its scores)
        hashes = np.ascontiguousarray(query.hashes, dtype=np.uint32)
        # a stem's unit weight in the text times its inverse document frequency (the weight over the text's scale)
        products = np.ascontiguousarray(query.weights * query.weights / query.scale, dtype=WEIGHT)
        for segment in reversed(segments):  # the newest first: a long text's budget goes to recent outputs first
            live_from = int(np.searchsorted(segment.ids, below))
            searched += len(segment.ids) - live_from
            if not len(hashes) or not len(segment.hashes):
                continue
            summed, read, complete = segment_scores(segment, hashes, products, budget)
            exact = exact and complete
            budget = max(0, budget - read)
            if summed is None:
                continue
            summed[:live_from] = 0.0
            scored.append((segment.ids, summed))
        k = 1 if exact else count
        for ids, summed in scored:
            top = np.argpartition(-summed, k - 1)[:k] if 1 < k < len(summed) else (
                np.arange(len(summed)) if k > 1 else np.asarray([int(np.argmax(summed))]))
            top = top[summed[top] > 0]
            found_ids.append(ids[top])
            found_scores.append(summed[top])
        if not found_ids:
            return Scored(np.zeros(0, np.int64), np.zeros(0), searched, exact)
        ids, similarities = np.concatenate(found_ids), np.concatenate(found_scores)
        order = np.argsort(-similarities, kind="stable")[:k]
        return Scored(ids[order], similarities[order].astype(np.float64), searched, exact)
