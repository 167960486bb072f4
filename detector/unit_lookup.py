"""Looking unit identities up in a common-unit table (``detector.common_units.CommonUnits``): open-addressing
hash tables over the table's identities (uniform 64-bit hashes: the low bits index them, linear probing), built
once per table (by its digest) and kept for the process.

Two layouts: the packed one the C scoring kernel searches (``detector.scoring_kernel``), and two plain arrays
at a lower load that numpy searches where the kernel is not built; both give the same frequencies. A binary
search over the sorted entries cost ~0.25 ms per 1,000 tokens in cache misses.
"""

from __future__ import annotations

import numpy as np

_hash_tables: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
_packed_tables: dict[str, tuple[np.ndarray, int]] = {}


def frequencies(table, ids: np.ndarray) -> np.ndarray:
    """The window frequency of each identity of ``ids`` (contiguous uint64) in ``table``, 0 where absent: a
    few vectorised numpy gathers over ``hash_table``'s slots at load <= 1/4."""
    slots, freqs, probes = hash_table(table)
    out = np.zeros(ids.shape[0], dtype=np.float32)
    if slots.shape[0] == 0 or ids.shape[0] == 0:
        return out
    mask = np.uint64(slots.shape[0] - 1)
    pending = np.arange(ids.shape[0])
    for probe in range(probes):
        at = (ids[pending] + np.uint64(probe)) & mask
        found = slots[at]
        hit = found == ids[pending]
        out[pending[hit]] = freqs[at[hit]]
        pending = pending[~hit & (found != 0)]  # an empty slot ends the search
        if pending.shape[0] == 0:
            break
    return out


def hash_table(table) -> tuple[np.ndarray, np.ndarray, int]:
    """(slots, frequencies, longest probe) of ``table``, built once per table (vectorised inserts)."""
    found = _hash_tables.get(table.digest)
    if found is None:
        size = 1 << max(4, int(4 * max(1, table.identities.shape[0]) - 1).bit_length())
        found = _hash_tables[table.digest] = _open_addressing(table.identities, table.frequencies, size)
    return found


def packed_hash_table(table) -> tuple[np.ndarray, int]:
    """(slots [S, 2] uint64: identity, then the frequency's float32 bits; longest probe) of ``table`` at load
    <= 1/2, built once per table: what the C scoring pass searches (``detector.scoring_kernel``), one cache
    line per lookup where ``hash_table``'s two arrays at load 1/4 touch two lines of 48 MB."""
    found = _packed_tables.get(table.digest)
    if found is None:
        size = 1 << max(4, int(2 * max(1, table.identities.shape[0]) - 1).bit_length())
        slots, freqs, probes = _open_addressing(table.identities, table.frequencies, size)
        packed = np.empty((size, 2), dtype=np.uint64)
        packed[:, 0] = slots
        packed[:, 1] = freqs.view(np.uint32)
        found = _packed_tables[table.digest] = (packed, probes)
    return found


def forget(digest: str) -> None:
    """Drop the hash tables of the table named ``digest`` (a replaced table's: tens of MB each)."""
    _packed_tables.pop(digest, None)
    _hash_tables.pop(digest, None)


def _open_addressing(ids: np.ndarray, freq: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Linear probing from an identity's low bits into ``size`` slots (a power of two): (slots, frequencies,
    longest probe)."""
    slots = np.zeros(size, dtype=np.uint64)
    freqs = np.zeros(size, dtype=np.float32)
    mask = np.uint64(size - 1)
    pending = np.arange(ids.shape[0])
    probe = 0
    while pending.shape[0]:  # every pending identity has found slots h .. h + probe - 1 taken
        at = (ids[pending] + np.uint64(probe)) & mask
        free = slots[at] == 0
        at_free, first = np.unique(at[free], return_index=True)  # one winner per free slot
        winners = pending[free][first]
        slots[at_free], freqs[at_free] = ids[winners], freq[winners]
        placed = np.zeros(ids.shape[0], dtype=bool)
        placed[winners] = True
        pending = pending[~placed[pending]]
        probe += 1
    return slots, freqs, probe
