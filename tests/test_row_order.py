"""Packed sort keys of unit rows against np.lexsort over the rows' columns, on random integer rows."""

import hashlib
import hmac

import numpy as np
import pytest

from detector.disclosure import _DITHER_DOMAIN, dither, dither_sorted
from detector.row_order import packed_keys, previous_and_order, same_as_previous, sorted_order
from detector.scoring import _previous


def lexsort_previous(units: np.ndarray) -> np.ndarray:
    """The straightforward definition: each row's previous equal row (-1 for a first occurrence)."""
    seen, prev = {}, []
    for i, row in enumerate(map(tuple, units.tolist())):
        prev.append(seen.get(row, -1))
        seen[row] = i
    return np.asarray(prev, dtype=np.int64)


def lexsort_dither(key: bytes, units: np.ndarray) -> float:
    """``dither`` with the rows sorted and deduplicated by Python's own tuple order."""
    rows = np.asarray(sorted(set(map(tuple, units.tolist()))), dtype=np.int64).reshape(-1, units.shape[1])
    mac = hmac.new(key, _DITHER_DOMAIN + b"fp|k|", hashlib.sha256)
    mac.update(rows.tobytes())
    return int.from_bytes(mac.digest()[:8], "little") / 2.0**64


# value ranges: tiny (many repeats, -1 padding as vllm:gumbel's), token ids, 32-bit, full int64 (kgw seeds)
RANGES = [(-1, 3), (0, 49152), (0, 2**32), (-(2**63), 2**63 - 1)]


@pytest.mark.parametrize("low,high", RANGES)
@pytest.mark.parametrize("columns", [1, 2, 3, 5, 9])
def test_packed_order_is_the_lexsort_order(low, high, columns):
    rng = np.random.default_rng(columns)
    for rows in (0, 1, 2, 7, 600):
        units = rng.integers(low, high, (rows, columns), dtype=np.int64, endpoint=True)
        if rows > 4:
            units[rows // 2:] = units[:rows - rows // 2]  # repeated rows, equal sort keys
        keys = packed_keys(units)
        order = sorted_order(keys)
        assert np.array_equal(order, np.lexsort(units.T[::-1]) if columns else np.arange(rows))
        same = (units[order][1:] == units[order][:-1]).all(axis=1)
        assert np.array_equal(same_as_previous(keys, order), same)
        assert np.array_equal(_previous(units), lexsort_previous(units))
        assert dither(b"k" * 32, "fp", "k", units) == lexsort_dither(b"k" * 32, units)


def test_the_dither_of_dedup_sorted_units_is_the_dither_of_the_counted_units():
    """sampling_verdict hands the dither the counted units in dedup's order: the same u as sorting them."""
    rng = np.random.default_rng(11)
    for rows in (0, 1, 5, 800):
        units = rng.integers(0, 40, (rows, 5))
        units[:, 1:4] = 0  # few distinct rows: many repeats
        prev, order = previous_and_order(units)
        left_out = rng.choice(rows, rows // 10, replace=False)
        prev[left_out] = left_out  # common or forced positions point at themselves
        counted = prev < 0
        expected = dither(b"k" * 32, "fp", "k", units[counted])
        assert dither_sorted(b"k" * 32, "fp", "k", units[order[counted[order]]]) == expected
        assert dither_sorted(b"k" * 32, "fp", "k", units[order]) == dither(b"k" * 32, "fp", "k", units)  # repeats
