"""Does a text share its wording with an output the service wrote under a key? (a scrubbed text keeps some)

A scrubber edits watermarked text until the z-test lets it go; edits it can afford leave most short runs
of the original tokens in place (a 5-gram survives a 20 % token substitution with probability 0.8^5 =
0.33). The service remembers what it wrote (``db.output_memory``), so besides the watermark it can ask
the question retrieval defences ask (Krishna et al., NeurIPS 2023): does this text repeat one remembered
output's wording? That question does not depend on the key's colours, so stealing them does not help
to evade it, and the answer is a fact about the service's own output, not a statistical accusation:
it is reported beside the verdict (``matches_own_output``, ``detector.service``) and never changes it.

An output is remembered as the set of its token 5-grams (``GRAM``), each named by a keyed 64-bit hash
(``gram_key``: derived from the master key, so a reader of the store cannot test a text it guesses) and
sampled by hash, one in ``SAMPLE``, minus the 5-grams of its own prompt (what the model copied from
the user's text is the user's wording: a human document whose first sentence was the prompt would
otherwise match). A text matches when at least ``MIN_MATCHED`` of its sampled 5-grams belong to one
remembered output and to no other output (5-grams several outputs share are phrases, not evidence), except
that an output which mostly copies one earlier output (greedy decoding asked again, a seeded request sent
twice, the same request continued) leaves that output's 5-grams to it (``db.count_table.OwnerTable``).

Measured on 2,845 real outputs of the default model and 2,325 human texts of eight domains (news,
encyclopedia, reviews, docs, code, package code, readmes, licences; ``research/scripts/own_output_match.py``,
docs/security.md): human texts share at most 4 such 5-grams with one output; outputs after random token
substitution at 10 / 20 / 30 / 40 % keep at least 8 in 100 / 99.75 / 91.5 / 42 % of cases.
"""

from __future__ import annotations

import collections
import ctypes
import functools
from dataclasses import dataclass

import numpy as np

from db.count_table import OwnerTable, native_library
from watermark.native_build import address

GRAM = 5  # tokens per remembered n-gram
SAMPLE = 2  # one n-gram in SAMPLE is kept (by hash): half the memory, the same separation (docs/security.md)
MIN_MATCHED = 8  # sampled n-grams of one output (and of no other) a text must repeat to match it
MASK64 = (1 << 64) - 1
PURPOSE = b"provmark/output-grams"  # the master-key derivation label of the n-gram hash key

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def gram_key(keyring) -> int:
    """The 64-bit key of the n-gram hash, derived from ``keyring``'s master key (the same in every worker
    of both services)."""
    return int.from_bytes(keyring.derive_key(PURPOSE)[:8], "little")


def text_grams(token_ids, key: int) -> np.ndarray:
    """The distinct sampled keyed n-gram hashes of ``token_ids`` (int64, sorted; never 0). The C kernel of
    ``db/csrc/count_table.c`` (``output_grams_hash``) where it is built, else numpy: the same numbers."""
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    count = ids.shape[0] - GRAM + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    library = native_library()
    if library is None:
        return numpy_grams(ids, key)
    out = np.empty(count, dtype=np.int64)
    kept = library.output_grams_hash(address(ids), ids.shape[0], GRAM, key & MASK64, SAMPLE - 1, address(out))
    return distinct(out[:kept])


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (``np.unique``'s result at a fraction of its overhead on a few hundred)."""
    values = np.sort(values)
    if values.shape[0] < 2:
        return values
    keep = np.empty(values.shape[0], dtype=bool)
    keep[0] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def numpy_grams(ids: np.ndarray, key: int) -> np.ndarray:
    """``text_grams`` in numpy."""
    x = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    count = x.shape[0] - GRAM + 1
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    h = np.full(count, np.uint64(key & MASK64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(GRAM):  # absorb one token per round, then a finaliser (splitmix64's)
            h ^= x[j:j + count]
            h *= _MIX[0]
            h ^= h >> np.uint64(29)
        h ^= h >> np.uint64(30)
        h *= _MIX[1]
        h ^= h >> np.uint64(27)
        h *= _MIX[2]
        h ^= h >> np.uint64(31)
    kept = h[(h & np.uint64(SAMPLE - 1)) == 0]
    return np.unique(kept[kept != 0].view(np.int64))


def output_grams(token_ids, prompt_ids, key: int) -> np.ndarray:
    """What the service remembers of one output: its sampled n-grams that are not in its prompt."""
    grams = text_grams(token_ids, key)
    if prompt_ids is not None and len(prompt_ids):
        grams = grams[~np.isin(grams, text_grams(prompt_ids, key), assume_unique=True)]
    return grams


@dataclass(frozen=True, slots=True)
class Match:
    """The remembered output a text repeats most: its row (``key_outputs.id``), how many of the text's sampled
    n-grams are that output's alone, out of how many the text has."""

    row: int
    matched: int
    text_grams: int

    @property
    def matches(self) -> bool:
        return self.matched >= MIN_MATCHED

    def to_dict(self) -> dict:
        """What a verdict reports (explain scope): no row id, no n-gram."""
        return {"matched": self.matches, "grams_matched": self.matched, "grams_in_text": self.text_grams,
                "min_matched": MIN_MATCHED}


class _MatchArguments(ctypes.Structure):
    """detector/csrc/kgw_units.c's match_request: output_grams_match's address and arguments, its answer."""

    _fields_ = [("fn", ctypes.c_void_p), ("gram", ctypes.c_int64), ("key", ctypes.c_uint64),
                ("sample_mask", ctypes.c_uint64), ("table", ctypes.c_void_p), ("table_mask", ctypes.c_uint64),
                ("table_shift", ctypes.c_int64), ("out", ctypes.c_int64 * 3), ("status", ctypes.c_int64)]


@functools.cache
def _match_function() -> int:
    return ctypes.cast(native_library().output_grams_match, ctypes.c_void_p).value


class MatchRequest:
    """``GramIndex.match_ids`` of one text, run by the detector's scoring kernel in the call that scores the text
    (``detector.scoring_kernel.kgw_scores``): a verdict then crosses into C once, where the match alone cost a
    crossing of its own (most of its time: docs/security.md, "What the defences cost"). ``address`` is what the
    kernel takes; ``result`` the same Match as ``match_ids``, or None when the kernel did not run it (the caller
    then calls ``match_ids``). Holds the index's table for as long as it lives (a rebuild swaps in another)."""

    __slots__ = ("_arguments", "_slots", "address")

    def __init__(self, slots, key: int) -> None:
        table, table_mask, table_shift = slots.args
        self._arguments = _MatchArguments(_match_function(), GRAM, key & MASK64, SAMPLE - 1, table, table_mask,
                                          table_shift)
        self._slots = slots
        self.address = ctypes.addressof(self._arguments)

    def result(self) -> Match | None:
        arguments = self._arguments
        if arguments.status != 1:
            return None
        out = arguments.out
        return Match(out[1], out[2], out[0])


class GramIndex:
    """Sampled n-gram -> the one remembered output that holds it (``db.count_table.OwnerTable``: its row, or
    "shared" once a second output holds it too, unless that output mostly copies the first), so an n-gram held
    by one output names it.

    ``capacity``: the most recent outputs it answers for (None: every one added). A detector worker holds one
    index per key for as long as it runs, so the service's own output must not grow it without bound: past
    ``capacity`` plus a quarter, the oldest are dropped and the table rebuilt from the rest (a reader keeps the
    table it started with; a rebuild swaps in a new one)."""

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity: expected None or an integer >= 0, got {capacity}")
        self.capacity = capacity
        self.table = OwnerTable()
        self._kept: collections.deque[tuple[int, np.ndarray]] = collections.deque()
        self.outputs = 0

    def add(self, row: int, grams: np.ndarray) -> None:
        """One output's distinct n-grams (``output_grams``) under its row id (>= 0)."""
        if row < 0:
            raise ValueError(f"row: expected a row id >= 0, got {row}")
        if self.capacity == 0:
            return
        grams = np.asarray(grams, dtype=np.int64)
        self.table.add_owner(grams, row)
        self.outputs += 1
        if self.capacity is None:
            return
        self._kept.append((row, grams))
        if len(self._kept) > self.capacity + max(1, self.capacity // 4):
            while len(self._kept) > self.capacity:
                self._kept.popleft()
            table = OwnerTable()  # the kept outputs in order, in one call: a copy defers to the output it copies
            table.add_owners([grams for _, grams in self._kept], [row for row, _ in self._kept])
            self.table, self.outputs = table, len(self._kept)  # filled before readers see it

    def match(self, grams: np.ndarray) -> Match | None:
        """The output the text's n-grams (``text_grams``) name most often (row -1 and 0 matched when none
        names one, or the text is shorter than one n-gram); None while nothing is remembered."""
        grams = np.asarray(grams, dtype=np.int64)
        if not self.outputs:
            return None
        if not grams.shape[0]:
            return Match(-1, 0, 0)
        owners = self.table.counts(grams)  # row + 1 of the one owner; -1 shared, 0 nobody's
        owned = owners > 0
        if not owned.any():
            return Match(-1, 0, int(grams.shape[0]))
        rows, counts = np.unique(owners[owned].astype(np.int64) - 1, return_counts=True)
        best = int(np.argmax(counts))
        return Match(int(rows[best]), int(counts[best]), int(grams.shape[0]))

    def match_request(self, key: int) -> MatchRequest | None:
        """A ``MatchRequest`` of this index under ``key`` for the scoring kernel to run; None while nothing is
        remembered (``match_ids`` answers None then) or without the C kernels."""
        table = self.table
        if not self.outputs or native_library() is None or not table.native:
            return None
        return MatchRequest(table.slots, key)

    def match_ids(self, token_ids, key: int) -> Match | None:
        """``match(text_grams(token_ids, key))`` in one C call where the kernel is built (``output_grams_match``:
        hashing, deduplication and the lookups without a sort or a numpy temporary; the detector runs it on
        every verdict), else that numpy path: the same Match."""
        if not self.outputs:
            return None
        library, table = native_library(), self.table  # one table for the whole call (a rebuild swaps it)
        if library is not None and table.native:
            ids = np.ascontiguousarray(token_ids, dtype=np.int64)
            slots = table.slots  # held for the call (a growing table swaps its allocation)
            out = (ctypes.c_int64 * 3)()  # Python ints out, no array to build or address
            if library.output_grams_match(address(ids), ids.shape[0], GRAM, key & MASK64, SAMPLE - 1,
                                          *slots.args, out) == 0:
                return Match(out[1], out[2], out[0])
        return self.match(text_grams(token_ids, key))
