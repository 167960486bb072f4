"""db.count_table: the detector worker's hash table of one key's unit counts. The C kernel and the numpy path
give the same counts and the same spoof-check sums (and those are the check's definition,
``detector.spoof_check.spoof_statistic``); the table grows and stays exact; identity 0 reads as never emitted."""

import math

import numpy as np
import pytest

from db import count_table
from db.count_table import CountTable
from detector.spoof_check import spoof_statistic, statistic_of_sums

needs_kernel = pytest.mark.skipif(count_table._library() is None, reason="no C compiler: the numpy path only")


def filled(native: bool, rng: np.random.Generator) -> tuple[CountTable, dict[int, int], np.ndarray]:
    pool = rng.integers(-(2**63), 2**63, size=5000, dtype=np.int64)
    table, expected = CountTable(native=native), {}
    for _ in range(40):  # outputs of distinct units, as the memory adds them; the table grows several times
        units = np.unique(pool[rng.zipf(1.2, size=300) % pool.size])
        table.add(units)
        for unit in units.tolist():
            expected[unit] = expected.get(unit, 0) + 1
    return table, expected, pool


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_kernel), False], ids=["kernel", "numpy"])
def test_counts_are_exact_as_the_table_grows(native):
    rng = np.random.default_rng(11)
    table, expected, pool = filled(native, rng)
    assert table.bits > count_table.MIN_BITS and table.size == len(expected)
    ask = np.concatenate([pool, rng.integers(-(2**63), 2**63, size=200, dtype=np.int64)])
    assert table.counts(ask.view(np.uint64)).tolist() == [float(expected.get(u, 0)) for u in ask.tolist()]
    units, counts = table.items()
    assert dict(zip(units.tolist(), counts.tolist())) == expected
    table.add(np.array([0, 0], dtype=np.int64))  # the empty marker is never stored
    assert table.size == len(expected) and table.counts(np.array([0], dtype=np.uint64)).tolist() == [0.0]


def test_the_kernel_and_numpy_give_the_checks_own_statistic():
    rng = np.random.default_rng(12)
    tables = [filled(native, np.random.default_rng(13))[0] for native in (True, False)]
    pool = filled(False, np.random.default_rng(13))[2]
    for scores_of in (lambda n: rng.random(n) < 0.4, lambda n: rng.exponential(size=n),
                      lambda n: rng.integers(0, 31, size=n)):
        units = pool[rng.integers(0, pool.size, size=900)].view(np.uint64)
        scores = np.asarray(scores_of(units.size), dtype=np.float64)
        prev = np.where(rng.random(units.size) < 0.3, 5, -1)  # positions that do not count
        counted = prev < 0
        learnability = np.log(tables[1].counts(units[counted]) + 0.5)
        expected = spoof_statistic(scores[counted], learnability)
        for table in tables if count_table._library() is not None else tables[1:]:
            check = statistic_of_sums(*table.spoof_sums(units, scores, prev))
            assert check.units == expected.units == int(counted.sum())
            assert check.z == pytest.approx(expected.z, rel=1e-10)
    flat = statistic_of_sums(*tables[1].spoof_sums(units, np.ones(units.size), prev))
    assert math.isnan(flat.z)  # every score equal: no statistic


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_kernel), False], ids=["kernel", "numpy"])
def test_readers_see_every_count_while_the_table_grows(native):
    """A detector worker's threads read the table while its sync adds outputs: a reader never sees a table
    being filled (a grown table is swapped in full) nor one freed under it."""
    import threading

    rng = np.random.default_rng(21)
    known = rng.integers(1, 2**62, size=500, dtype=np.int64)
    table = CountTable(known, np.full(known.size, 3), native=native)
    wrong, done = [], threading.Event()

    def read():
        while not done.is_set():
            found = table.counts(known)
            if not (found == 3.0).all():
                wrong.append(int((found != 3.0).sum()))
            n = table.spoof_sums(known, np.ones(known.size), np.full(known.size, -1))[0]
            if n != known.size:
                wrong.append(n)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in readers:
        thread.start()
    try:
        for _ in range(12 if native else 4):  # new units only: the table grows several times
            table.add(rng.integers(2**62, 2**63 - 1, size=table.bits * (600 if native else 150), dtype=np.int64))
    finally:
        done.set()
        for thread in readers:
            thread.join()
    assert table.bits > 12 and not wrong


def test_the_kernels_address_of_an_array_is_its_first_element_for_every_layout():
    """``watermark.native_build.address`` (every kernel call's pointer argument): a ctypes view of the buffer where
    that exists, ``.ctypes.data`` where it does not; either way the first element, and the array is unchanged."""
    from watermark.native_build import address

    base = np.arange(60, dtype=np.int64)
    readonly = base.copy()
    readonly.flags.writeable = False
    layouts = {"plain": base, "offset slice": base[7:], "strided": base[::3], "read-only": readonly,
               "from bytes": np.frombuffer(base.tobytes(), dtype=np.int64), "empty": base[:0],
               "2-d": base.reshape(6, 10), "fortran": np.asfortranarray(base.reshape(6, 10)), "bool": base > 5,
               "uint64 view": base.view(np.uint64), "transposed": base.reshape(6, 10).T}
    for name, array in layouts.items():
        before = array.copy()
        assert address(array) == array.ctypes.data, name
        np.testing.assert_array_equal(array, before)
    # a view the buffer path accepts: writing through the address lands in the array
    target = np.zeros(4, dtype=np.int64)[1:]
    ctypes_view = (np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int64 * 3).from_address(address(target))))
    ctypes_view[:] = (5, 6, 7)
    np.testing.assert_array_equal(target, [5, 6, 7])
