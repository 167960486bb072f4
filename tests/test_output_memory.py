"""db.output_memory on both backends (a SQLite file and a real PostgreSQL server): each output's distinct units
counted once, counts of units never emitted 0, lookups past one statement's chunk, 64-bit identities with the
top bit set, and the null window of the most recent outputs past the warm-up; the detector's in-process copy
of it gives the same counts and null."""

import numpy as np

from db import output_memory
from db.output_memory import WARMUP, MemoryMirror, OutputMemory
from db.rows import KeyOutputRow, utc_now
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


def test_the_detectors_copy_follows_the_store_on_each_backend(database_url):
    """``MemoryMirror`` (what a detector worker reads on every positive verdict, instead of a query per text)
    gives the store's own counts and null: loaded from the aggregate, then following new outputs through
    their rows, as its table grows, per key, and through a row written without its units (an older
    generation service: it reloads)."""
    store = Store(url=database_url)
    store.upgrade()
    memory = OutputMemory(store)
    mirror = MemoryMirror(memory, sync_seconds=0.0)
    rng = np.random.default_rng(7)
    pool = rng.integers(0, 2**64, size=3000, dtype=np.uint64)  # many above 2**63
    ask = np.concatenate([pool, rng.integers(0, 2**64, size=50, dtype=np.uint64)])  # and never emitted

    def record(key, n):
        for _ in range(n):
            units = pool[rng.zipf(1.3, size=150) % pool.size]
            memory.record(key, units, float(rng.normal(1.8, 1.0)))

    def agrees(key):
        view = mirror.view(key)
        assert view.counts(ask).tolist() == memory.counts_of(key, ask).tolist()
        assert sorted(view.null.z.tolist()) == sorted(memory.null_of(key).tolist())

    record("k", WARMUP + 20)
    agrees("k")  # the first view loads the aggregate
    grown, bits = 0, mirror.view("k").table.bits
    for _ in range(6):  # then follows outputs row by row; the recent part is merged into the base as it grows
        record("k", 25)
        agrees("k")
        grown += mirror.view("k").table.bits > bits
        bits = mirror.view("k").table.bits
    assert grown >= 1  # the table was rehashed into a larger one on the way
    record("other", 3)
    agrees("other")
    agrees("k")
    with store.write() as session:  # an output remembered without its units (a service before this change)
        session.add(KeyOutputRow(key_id="k", outputs_before=memory.outputs("k"), z=0.5, units=None,
                                 created_at=utc_now()))
    memory.record("k", pool[:5], None)
    agrees("k")
    stale = MemoryMirror(memory, sync_seconds=3600.0)
    before = stale.view("k").counts(pool[:5]).tolist()
    record("k", 2)
    assert stale.view("k").counts(pool[:5]).tolist() == before  # within its sync interval it does not ask
    store.close()


def test_upgrading_a_store_keeps_its_memory_and_the_copy_reads_it(database_url):
    """A store the previous version wrote (revision 0003: output rows without their units) keeps every count
    and null row through the upgrade, and the detector's copy loads it from the aggregate, then follows new
    outputs by their rows."""
    from alembic import command
    from sqlalchemy import text

    from db.migrations import alembic_config, head_revision

    store = Store(url=database_url)
    config = alembic_config()
    with store.write_engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0003_output_memory")
    rng = np.random.default_rng(9)
    units = rng.integers(-(2**63), 2**63, size=300, dtype=np.int64)
    with store.write_engine.begin() as connection:  # what 0003's service wrote: counts, and rows without units
        for unit in units.tolist():
            connection.execute(text("INSERT INTO output_units (key_id, unit, outputs) VALUES ('k', :u, 3)"), {"u": unit})
        for i in range(WARMUP + 3):
            connection.execute(text("INSERT INTO key_outputs (key_id, outputs_before, z, created_at) "
                                    "VALUES ('k', :i, :z, CURRENT_TIMESTAMP)"), {"i": i, "z": float(i)})
    assert store.upgrade() == head_revision()
    memory = OutputMemory(store)
    ask = units.view(np.uint64)
    assert memory.counts_of("k", ask).tolist() == [3.0] * units.size
    assert sorted(memory.null_of("k").tolist()) == [float(i) for i in range(WARMUP, WARMUP + 3)]
    view = MemoryMirror(memory, sync_seconds=0.0).view("k")
    assert view.counts(ask).tolist() == [3.0] * units.size and view.null.z.tolist() == [40.0, 41.0, 42.0]
    memory.record("k", ask[:10], 7.0)
    assert view.counts(ask[:11]).tolist() == [3.0] * 11  # the copy asks again only on its next view
    mirror = MemoryMirror(memory, sync_seconds=0.0)
    mirror.view("k")
    memory.record("k", ask[:10], 8.0)
    assert mirror.view("k").counts(ask[:11]).tolist() == [5.0] * 10 + [3.0]
    assert mirror.view("k").null.z.tolist() == [7.0, 8.0, 40.0, 41.0, 42.0]  # sorted
    store.close()
