"""Unit identity -> count, as a detector worker holds one key's memory of its own output (``db.output_memory``).

An open-addressing hash table (linear probing from the identity's top bits; identities are 64-bit hashes, so
those are uniform) of (unit, count) pairs side by side in one numpy array, kept at most half full. The spoof check looks up every counted unit of
a positive verdict: one or two cache lines per unit, where a binary search over the same units sorted touched
~17 (measured: a 1,000-token positive's lookups cost 0.15-0.25 ms in a detection's working set that way).
``csrc/count_table.c`` does the adds, lookups and the spoof check's sums in C, built once with the system
compiler and cached like the other native kernels (``watermark.native_build``); without a compiler, or with
``PROVMARK_NATIVE=0``, numpy gives the same numbers.

A unit whose identity is exactly 0 marks an empty slot and reads as never emitted (a 2^-64 chance per unit).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from watermark.native_build import build_cached

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "count_table.c"
FLAGS = ("-O2", "-shared", "-fPIC")
DISABLE_ENV = "PROVMARK_NATIVE"  # one setting turns every native kernel off
MIN_BITS = 10


@functools.cache
def _library():
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found")
        library = ctypes.CDLL(str(build_cached(compiler, SOURCE, FLAGS, "count_table", libs=("-lm",))))
    except (OSError, RuntimeError) as exc:
        log.info("count-table kernel unavailable, using numpy: %s", exc)
        return None
    pointer, size, shift = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    mask = ctypes.c_uint64
    library.count_table_add.argtypes = [pointer, mask, shift, pointer, pointer, size]
    library.count_table_add.restype = size
    library.count_table_counts.argtypes = [pointer, mask, shift, pointer, size, pointer]
    library.count_table_counts.restype = None
    library.count_table_spoof_sums.argtypes = [pointer, mask, shift, pointer, pointer, pointer, size, pointer]
    library.count_table_spoof_sums.restype = None
    return library


def _address(array: np.ndarray) -> int:
    return array.ctypes.data


class CountTable:
    """``add`` counts, ``counts`` of identities, ``spoof_sums`` for the spoof check (``native`` False: numpy)."""

    def __init__(self, units: np.ndarray | None = None, counts: np.ndarray | None = None, native: bool = True) -> None:
        self._lib = _library() if native else None
        self.size = 0
        self._allocate(MIN_BITS)
        if units is not None and len(units):
            self.add(units, counts)

    def _allocate(self, bits: int) -> None:
        self.bits = bits
        self.slots = np.zeros(2 << bits, dtype=np.int64)  # (unit, count) pairs; unit 0: empty
        self.keys, self.vals = self.slots[0::2], self.slots[1::2]  # views
        self._mask, self._shift = (1 << bits) - 1, 64 - bits
        self._slots = (_address(self.slots), self._mask, self._shift)

    def add(self, units: np.ndarray, increments: np.ndarray | None = None) -> None:
        """Each unit's count += its increment (1 when None). Units are int64 or uint64 identities."""
        units = np.ascontiguousarray(np.asarray(units).view(np.int64) if np.asarray(units).dtype == np.uint64
                                     else units, dtype=np.int64)
        increments = (np.ones(units.shape[0], dtype=np.int64) if increments is None
                      else np.ascontiguousarray(increments, dtype=np.int64))
        if 2 * (self.size + units.shape[0]) > self.keys.shape[0]:  # at most half full after the add
            self._grow(self.size + units.shape[0])
        if self._lib is not None:
            self.size += self._lib.count_table_add(*self._slots, _address(units), _address(increments), units.shape[0])
            return
        keys, vals, mask = self.keys, self.vals, self._mask
        for unit, increment in zip(units.tolist(), increments.tolist()):
            if unit == 0:
                continue
            slot = (unit & 0xFFFFFFFFFFFFFFFF) >> self._shift
            while keys[slot] != 0 and keys[slot] != unit:
                slot = (slot + 1) & mask
            if keys[slot] == 0:
                keys[slot] = unit
                self.size += 1
            vals[slot] += increment

    def _grow(self, entries: int) -> None:
        used = self.keys != 0
        units, counts = self.keys[used], self.vals[used]
        bits = max(MIN_BITS, int(2 * entries - 1).bit_length())
        self._allocate(bits)
        self.size = 0
        if units.shape[0]:
            self.add(units, counts)

    def counts(self, units: np.ndarray) -> np.ndarray:
        """float64 count of each identity (0 for a unit never added)."""
        query = np.ascontiguousarray(np.asarray(units, dtype=np.uint64).view(np.int64))
        out = np.empty(query.shape[0], dtype=np.float64)
        if self._lib is not None:
            self._lib.count_table_counts(*self._slots, _address(query), query.shape[0], _address(out))
            return out
        return self._numpy_counts(query)

    def _numpy_counts(self, query: np.ndarray) -> np.ndarray:
        """Probe rounds over the queries not yet settled (hit, or an empty slot)."""
        out = np.zeros(query.shape[0], dtype=np.float64)
        slot = (query.view(np.uint64) >> np.uint64(self._shift)).astype(np.int64)
        pending = np.flatnonzero(query != 0)
        slot, wanted = slot[pending], query[pending]
        while pending.shape[0]:
            found = self.keys[slot]
            hit = found == wanted
            out[pending[hit]] = self.vals[slot[hit]]
            going = ~hit & (found != 0)
            pending, slot, wanted = pending[going], (slot[going] + 1) & self._mask, wanted[going]
        return out

    def spoof_sums(self, units: np.ndarray, scores: np.ndarray, prev: np.ndarray) -> tuple[int, float, float, float,
                                                                                            float, float]:
        """Over the positions with ``prev`` < 0, x = log(count + 1/2) of the unit and y its score: (n, Sxx, Syy,
        Sxy about the means, sum x^2, sum y^2). ``units`` uint64 or int64, ``scores`` float64, ``prev`` int64."""
        query = np.ascontiguousarray(units.view(np.int64) if units.dtype == np.uint64 else units, dtype=np.int64)
        y = np.ascontiguousarray(scores, dtype=np.float64)
        first = np.ascontiguousarray(prev, dtype=np.int64)
        if not query.shape[0] == y.shape[0] == first.shape[0]:
            raise ValueError(f"units, scores and prev: expected one length, got {query.shape[0]}, {y.shape[0]}, "
                             f"{first.shape[0]}")
        if self._lib is not None:
            out = (ctypes.c_double * 6)()
            self._lib.count_table_spoof_sums(*self._slots, _address(query), _address(y), _address(first),
                                             query.shape[0], out)
            n, spread_x, spread_y, sum_xy, raw_x, raw_y = out
            return int(n), spread_x, spread_y, sum_xy, raw_x, raw_y
        counted = first < 0
        x, y = np.log(self._numpy_counts(query[counted]) + 0.5), y[counted]
        if not x.shape[0]:
            return 0, 0.0, 0.0, 0.0, 0.0, 0.0
        cx, cy = x - x.sum() / x.shape[0], y - y.sum() / y.shape[0]
        return x.shape[0], float(cx @ cx), float(cy @ cy), float(y @ cx), float(x @ x), float(y @ y)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """(Every unit in the table [int64], its count), in slot order."""
        used = self.keys != 0
        return self.keys[used], self.vals[used]
