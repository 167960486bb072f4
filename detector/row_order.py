"""Sorting rows of token ids (dedup units, the dither's set of units) with few sort keys.

A unit is a row of k token ids ([N, k] int64: 2 columns for kgw's pairs, h + 1 = 5 for the sampling specs'
n-grams). ``np.lexsort`` over k columns costs one stable sort pass per column; token ids need ~16 bits, so
several columns fit one uint64 key, and keys that hold the columns in order, the first in the high bits,
compare exactly as the rows do: the same order (ties kept in row order), the same equal rows.
"""

from __future__ import annotations

import numpy as np

_KEY_BITS = 64


def packed_keys(rows: np.ndarray) -> list[np.ndarray]:
    """Sort keys of integer rows [N, k], most significant first: lexicographic order and equality of the
    keys are those of the rows. Columns are packed (shifted by the smallest value, so -1 padding
    packs too) as many to a uint64 key as the rows' value range allows; one key per column otherwise."""
    n, k = rows.shape
    if n == 0 or k == 0:
        return [rows[:, j] for j in range(k)]
    low, high = int(rows.min()), int(rows.max())
    bits = max(1, (high - low).bit_length())
    per_key = _KEY_BITS // bits
    if per_key < 2:
        return [rows[:, j] for j in range(k)]
    shifted = (rows - low).astype(np.uint64) if low else rows.astype(np.uint64)
    shift = np.uint64(bits)
    keys = []
    for start in range(0, k, per_key):
        key = shifted[:, start].copy()
        for j in range(start + 1, min(start + per_key, k)):
            key <<= shift
            key |= shifted[:, j]
        keys.append(key)
    return keys


def sorted_order(keys: list[np.ndarray]) -> np.ndarray:
    """The stable order of rows by ``packed_keys`` (``np.lexsort`` over the rows' columns, first column first)."""
    if len(keys) == 1:
        return np.argsort(keys[0], kind="stable")
    return np.lexsort(keys[::-1])


def same_as_previous(keys: list[np.ndarray], order: np.ndarray) -> np.ndarray:
    """[N - 1] bool: row ``order[i + 1]`` equals row ``order[i]``."""
    same = np.ones(max(0, order.shape[0] - 1), dtype=bool)
    for key in keys:
        sorted_key = key[order]
        same &= sorted_key[1:] == sorted_key[:-1]
    return same


def previous_and_order(units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's previous equal row (-1 for a first occurrence) and the rows' stable sorted order."""
    count = units.shape[0]
    prev = np.full(count, -1, dtype=np.int64)
    if count < 2:
        return prev, np.arange(count)
    keys = packed_keys(units)
    order = sorted_order(keys)  # stable: equal units end up adjacent, in text order
    same = same_as_previous(keys, order)
    prev[order[1:][same]] = order[:-1][same]
    return prev, order
