"""Unit identity -> count, as a detector worker holds one key's memory of its own output (``db.output_memory``).

An open-addressing hash table (linear probing from the identity's top bits; identities are 64-bit hashes, so
those are uniform) of (unit, count) pairs side by side in one numpy array, kept at most half full. The spoof
check looks up every counted unit of a positive verdict: one or two cache lines per unit, where a binary search
over the same units sorted touched ~17 (measured: a 1,000-token positive's lookups cost 0.15-0.25 ms in a detection's working set that way).
``csrc/count_table.c`` does the adds, lookups and the spoof check's sums in C, built once with the system
compiler and cached like the other native kernels (``watermark.native_build``); without a compiler, or with
``PROVMARK_NATIVE=0``, numpy gives the same numbers.

A unit whose identity is exactly 0 marks an empty slot and reads as never emitted (a 2^-64 chance per unit).
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import numpy as np

from watermark.native_build import address as _address
from watermark.native_build import optional_c_library

SOURCE = Path(__file__).with_name("csrc") / "count_table.c"
FLAGS = ("-O2", "-shared", "-fPIC")
MIN_BITS = 10


@functools.cache
def _library():
    pointer, size, shift, mask = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint64
    return optional_c_library(SOURCE, FLAGS, "count_table", "numpy", {
        "table_add": ([pointer, mask, shift, pointer, pointer, size, ctypes.c_int], size),
        "owner_table_add_outputs": ([pointer, mask, shift, pointer, pointer, pointer, size], size),
        "count_table_counts": ([pointer, mask, shift, pointer, size, pointer], None),
        "count_table_spoof_sums": ([pointer, mask, shift, pointer, pointer, pointer, size, pointer], None),
        "output_grams_hash": ([pointer, size, ctypes.c_int, mask, mask, pointer], size),
        "output_grams_match": ([pointer, size, ctypes.c_int, mask, mask, pointer, mask, shift, pointer], ctypes.c_int),
    }, libs=("-lm",))


def native_library():
    """The C kernels of this module's source (None without a compiler, or with ``PROVMARK_NATIVE=0``)."""
    return _library()


class _Slots:
    """One allocation of the table: (unit, count) pairs side by side, unit 0 empty; what a call reads, held by
    the call (a table that grows meanwhile swaps in a new one, filled before the swap, and frees this one
    only when the last call holding it returns)."""

    __slots__ = ("bits", "pairs", "keys", "vals", "mask", "shift", "args")

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.pairs = np.zeros(2 << bits, dtype=np.int64)
        self.keys, self.vals = self.pairs[0::2], self.pairs[1::2]  # views
        self.mask, self.shift = (1 << bits) - 1, 64 - bits
        self.args = (_address(self.pairs), self.mask, self.shift)  # the C functions' first three arguments


class CountTable:
    """``add`` counts, ``counts`` of identities, ``spoof_sums`` for the spoof check (``native`` False: numpy).
    One writer (``add``) and any number of readers at once: readers see the table before or after an add."""

    OWNERS = 0  # how ``table_add`` merges a unit already in the table: counts sum (OwnerTable: 1)

    def __init__(self, units: np.ndarray | None = None, counts: np.ndarray | None = None, native: bool = True) -> None:
        self._lib = _library() if native else None
        self.size = 0
        self._slots = _Slots(MIN_BITS)
        if units is not None and len(units):
            self.add(units, counts)

    @property
    def bits(self) -> int:
        return self._slots.bits

    @property
    def native(self) -> bool:
        """Whether the C kernels serve this table."""
        return self._lib is not None

    @property
    def slots(self) -> _Slots:
        """The current allocation (a C call that reads it holds this object for the call)."""
        return self._slots

    def add(self, units: np.ndarray, increments: np.ndarray | None = None) -> None:
        """Each unit's count += its increment (1 when None). Units are int64 or uint64 identities."""
        units = as_int64(units)
        increments = (np.ones(units.shape[0], dtype=np.int64) if increments is None
                      else np.ascontiguousarray(increments, dtype=np.int64))
        self.size += self._insert(self._room_for(units.shape[0]), units, increments)

    def _room_for(self, more: int) -> _Slots:
        """The allocation to add ``more`` units to: this one, or a larger copy (at most half full after the add)."""
        slots = self._slots
        if 2 * (self.size + more) > slots.keys.shape[0]:
            used = slots.keys != 0
            grown = _Slots(max(MIN_BITS, int(2 * (self.size + more) - 1).bit_length()))
            self._insert(grown, slots.keys[used].copy(), slots.vals[used].copy())  # new units: values as they are
            self._slots = slots = grown  # filled before readers see it
        return slots

    def _insert(self, slots: _Slots, units: np.ndarray, values: np.ndarray, keep: int = 0) -> int:
        """Add into ``slots`` (``merge`` in ``csrc/count_table.c``: counts sum, an owner table's values name
        one owner, and a unit ``keep`` holds stays its); how many units were new."""
        if self._lib is not None and not keep:
            return self._lib.table_add(*slots.args, _address(units), _address(values), units.shape[0], self.OWNERS)
        keys, vals, mask, added = slots.keys, slots.vals, slots.mask, 0
        for unit, value in zip(units.tolist(), values.tolist()):
            if unit == 0:
                continue
            slot = (unit & 0xFFFFFFFFFFFFFFFF) >> slots.shift
            while keys[slot] != 0 and keys[slot] != unit:
                slot = (slot + 1) & mask
            if keys[slot] == 0:
                keys[slot], vals[slot] = unit, value
                added += 1
            elif not self.OWNERS:
                vals[slot] += value
            elif vals[slot] != value and (keep <= 0 or vals[slot] != keep):
                vals[slot] = -1
        return added

    def counts(self, units: np.ndarray) -> np.ndarray:
        """float64 count of each identity (0 for a unit never added)."""
        query, slots = as_int64(units), self._slots
        if self._lib is not None:
            out = np.empty(query.shape[0], dtype=np.float64)
            self._lib.count_table_counts(*slots.args, _address(query), query.shape[0], _address(out))
            return out
        return _numpy_counts(slots, query)

    def spoof_sums(self, units: np.ndarray, scores: np.ndarray, prev: np.ndarray) -> tuple[int, float, float, float,
                                                                                            float, float]:
        """Over the positions with ``prev`` < 0, x = log(count + 1/2) of the unit and y its score: (n, Sxx, Syy,
        Sxy about the means, sum x^2, sum y^2). ``units`` uint64 or int64, ``scores`` float64, ``prev`` int64."""
        query, slots = as_int64(units), self._slots
        y = np.ascontiguousarray(scores, dtype=np.float64)
        first = np.ascontiguousarray(prev, dtype=np.int64)
        if not query.shape[0] == y.shape[0] == first.shape[0]:
            raise ValueError(f"units, scores and prev: expected one length, got {query.shape[0]}, {y.shape[0]}, "
                             f"{first.shape[0]}")
        if self._lib is not None:
            out = (ctypes.c_double * 6)()
            self._lib.count_table_spoof_sums(*slots.args, _address(query), _address(y), _address(first),
                                             query.shape[0], out)
            n, spread_x, spread_y, sum_xy, raw_x, raw_y = out
            return int(n), spread_x, spread_y, sum_xy, raw_x, raw_y
        counted = first < 0
        x, y = np.log(_numpy_counts(slots, query[counted]) + 0.5), y[counted]
        if not x.shape[0]:
            return 0, 0.0, 0.0, 0.0, 0.0, 0.0
        cx, cy = x - x.sum() / x.shape[0], y - y.sum() / y.shape[0]
        return x.shape[0], float(cx @ cx), float(cy @ cy), float(y @ cx), float(x @ x), float(y @ y)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(Every unit in the table [int64], its count), in slot order."""
        slots = self._slots
        used = slots.keys != 0
        return slots.keys[used], slots.vals[used]


class OwnerTable(CountTable):
    """Which one output holds each n-gram (``db.output_grams.GramIndex``): the value is the output's row + 1
    while one output holds it, -1 once two do, 0 when none does (``counts`` reads it). Half the memory and
    one lookup where a count of holders and a sum of their rows took two tables."""

    OWNERS = 1

    def add_owner(self, units: np.ndarray, row: int) -> None:
        """One output's distinct n-grams (int64 or uint64) under its row (>= 0): ``add_owners`` of one."""
        self.add_owners([units], [row])

    def add_owners(self, outputs: list[np.ndarray], rows: list[int]) -> None:
        """Outputs' distinct n-grams under their rows (>= 0), in order: one C call (``owner_table_add_outputs``)
        into a table grown once, as an index is rebuilt. When one earlier output alone holds at least half of an
        output's n-grams, the output is a copy of it (the same prompt and seed sampled twice, greedy decoding
        asked again, or that output continued): what that output holds stays its, so the copy does not make
        the original's wording "shared" and unrecognisable."""
        if len(outputs) != len(rows):
            raise ValueError(f"outputs and rows: expected one length, got {len(outputs)} and {len(rows)}")
        parts = [as_int64(units) for units in outputs]
        units = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        values = np.asarray(rows, dtype=np.int64) + 1
        slots = self._room_for(units.shape[0])
        if self._lib is not None:
            offsets = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([p.shape[0] for p in parts], out=offsets[1:])
            added = self._lib.owner_table_add_outputs(*slots.args, _address(units), _address(offsets),
                                                      _address(values), len(parts))
            if added != ctypes.c_size_t(-1).value:
                self.size += added
                return
        for part, value in zip(parts, values.tolist()):
            held = _numpy_counts(slots, part) if part.shape[0] else np.zeros(0)
            held = held[held > 0].astype(np.int64)
            keep = 0
            if held.shape[0]:
                owners, counts = np.unique(held, return_counts=True)
                best = int(np.argmax(counts))
                if 2 * int(counts[best]) >= part.shape[0]:
                    keep = int(owners[best])
            self.size += self._insert(slots, part, np.full(part.shape[0], value, dtype=np.int64), keep)

    def add(self, units: np.ndarray, increments: np.ndarray | None = None) -> None:
        raise TypeError("an owner table takes whole outputs: add_owner(units, row)")


def as_int64(units) -> np.ndarray:
    """Unit identities (uint64 or int64) as contiguous int64 (the same 64 bits)."""
    units = np.asarray(units)
    return np.ascontiguousarray(units.view(np.int64) if units.dtype == np.uint64 else units, dtype=np.int64)


def _numpy_counts(slots: _Slots, query: np.ndarray) -> np.ndarray:
    """Probe rounds over the queries not yet settled (hit, or an empty slot)."""
    out = np.zeros(query.shape[0], dtype=np.float64)
    slot = (query.view(np.uint64) >> np.uint64(slots.shift)).astype(np.int64)
    pending = np.flatnonzero(query != 0)
    slot, wanted = slot[pending], query[pending]
    while pending.shape[0]:
        found = slots.keys[slot]
        hit = found == wanted
        out[pending[hit]] = slots.vals[slot[hit]]
        going = ~hit & (found != 0)
        pending, slot, wanted = pending[going], (slot[going] + 1) & slots.mask, wanted[going]
    return out
