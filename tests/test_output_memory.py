"""db.output_memory on both backends (a SQLite file and a real PostgreSQL server): each output's distinct units
counted once, counts of units never emitted 0, lookups past one statement's chunk, 64-bit identities with the
top bit set, and the null window of the most recent outputs past the warm-up."""

import numpy as np

from db import output_memory
from db.output_memory import WARMUP, OutputMemory
from db.store import Store

pytest_plugins = ["pg"]


def test_counts_and_null_on_each_backend(database_url, monkeypatch):
    store = Store(url=database_url)
    store.upgrade()
    memory = OutputMemory(store)
    rng = np.random.default_rng(5)
    shared = rng.integers(0, 2**64, size=700, dtype=np.uint64)  # > CHUNK, many above 2**63
    assert (shared >= np.uint64(2**63)).any()
    outputs = 3
    for i in range(outputs):
        memory.record("k", np.concatenate([shared, shared[:10]]), float(i))  # repeats within one output count once
    memory.record("other", shared[:5], 0.5)
    never = rng.integers(0, 2**64, size=20, dtype=np.uint64)
    ask = np.concatenate([never[:3], shared, never[3:]])
    monkeypatch.setattr(output_memory, "CHUNK", 250)  # several statements per lookup
    found = memory.counts_of("k", ask)
    assert found.tolist() == [0.0] * 3 + [float(outputs)] * len(shared) + [0.0] * 17
    assert memory.counts_of("other", shared[:7]).tolist() == [1.0] * 5 + [0.0] * 2
    assert memory.outputs("k") == outputs
    assert memory.null_of("k").size == 0  # every output still in the warm-up
    for i in range(WARMUP + 5):
        memory.record("w", shared[:3], float(i))
    assert sorted(memory.null_of("w").tolist()) == [float(i) for i in range(WARMUP, WARMUP + 5)]
    assert memory.null_of("w", limit=2).tolist() == [float(WARMUP + 4), float(WARMUP + 3)]  # the most recent
    store.close()
