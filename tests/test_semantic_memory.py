"""db.semantic_memory and db.passage_vectors on both backends (a SQLite file and a real PostgreSQL server): what
a row holds (a rotated, quantised vector and a receipt id: no text), retention of the newest N per key, purge with
the key, the memory turned off, and a detector worker's copy (``VectorMirror``) following new rows and a purge."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import inspect, select

from api.cli.main import main
from db.passage_vectors import DIM, FORM, quantised, rotation, stored_form, unit
from db.rows import OutputVectorRow
from db.semantic_memory import EXPANSION_SEARCH, KeyVectors, SemanticMemory, VectorMirror, expansion_for
from db.store import Store

pytest_plugins = ["pg"]

TEXT = "The city council voted on Tuesday night to close the old public library on Main Street."


def random_vectors(count: int, seed: int = 0) -> np.ndarray:
    return stored_form(unit(np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32)),
                       bytes(32))


def test_the_stored_form_keeps_cosines_and_is_keyed():
    raw = unit(np.random.default_rng(1).standard_normal((50, DIM)).astype(np.float32))
    stored = stored_form(raw, b"a" * 32).astype(np.float32)
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    assert np.abs(stored @ stored.T - raw @ raw.T).max() < 0.01  # rotation keeps cosines; int8 costs < 0.01
    other = stored_form(raw, b"b" * 32)
    assert not np.array_equal(other, stored_form(raw, b"a" * 32))  # another master key, other bytes
    q = rotation(b"a" * 32)
    assert np.allclose(q @ q.T, np.eye(DIM), atol=1e-5)
    assert quantised(np.zeros((1, DIM))).tolist() == [[0] * DIM]
    assert np.abs(quantised(raw)).max() == 127


def test_a_row_holds_a_vector_and_a_receipt_no_text(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    vector = random_vectors(1)[0]
    memory.record("k", "receipt-1", vector, b"\x01\x02\x03\x04\x01")
    columns = {c["name"] for c in inspect(store.engine).get_columns("output_vectors")}
    assert columns == {"id", "key_id", "receipt_id", "created_at", "vector", "form", "signature"}
    with store.read() as session:
        row = session.scalars(select(OutputVectorRow)).one()
    assert row.form == FORM and memory.signatures_of([row.id, row.id + 1]) == {row.id: b"\x01\x02\x03\x04\x01"}
    assert len(row.vector) == DIM and np.array_equal(np.frombuffer(row.vector, dtype=np.int8), vector)
    assert TEXT.encode() not in row.vector and memory.receipt_of(row.id) == "receipt-1"
    with pytest.raises(ValueError, match="int8"):
        memory.record("k", "receipt-2", vector.astype(np.float32))
    store.close()


def test_rows_of_an_older_form_are_not_compared(database_url):
    """A vector made by an older recipe (form 1: the meaning part alone, before revision 0012) lives in another
    space: a copy neither loads it nor follows it, and the key's count leaves it out."""
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    old, new = random_vectors(2)
    memory.record("k", "receipt-new", new)
    with store.write() as session:
        session.add(OutputVectorRow(key_id="k", receipt_id="receipt-old", vector=old.tobytes(), form=FORM - 1))
    assert memory.count("k") == 1
    mirror = VectorMirror(memory, sync_seconds=0.0)
    found = mirror.nearest("k", old)
    assert found.searched == 1 and memory.receipt_of(found.row) == "receipt-new"
    memory.record("k", "receipt-newer", old)  # followed: the current form's rows arrive, the old one stays out
    assert memory.receipt_of(mirror.nearest("k", old).row) == "receipt-newer" and len(mirror.view("k")) == 2
    store.close()


def test_retention_keeps_the_newest_per_key_and_purge_deletes_the_key(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store, keep=5, prune_every=1)
    vectors = random_vectors(12)
    for i, vector in enumerate(vectors):
        memory.record("k", f"r{i}", vector)
    memory.record("other", "o0", vectors[0])
    assert memory.count("k") == 5 and memory.count("other") == 1
    kept = memory.newest_rows("k", 100)
    assert [memory.receipt_of(i) for i, _ in kept] == [f"r{i}" for i in range(7, 12)]  # the newest five
    assert memory.purge("k") == 5 and memory.count("k") == 0 and memory.count("other") == 1
    off = SemanticMemory(store, keep=0)
    off.record("k", "ignored", vectors[0])
    assert not off.enabled and memory.count("k") == 0
    store.close()


def test_the_mirror_follows_new_outputs_drops_old_ones_and_reloads_after_a_purge(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store, keep=6, prune_every=1)
    mirror = VectorMirror(memory, sync_seconds=0.0)
    vectors = random_vectors(10, seed=3)
    assert mirror.nearest("k", vectors[0]) is None  # nothing remembered
    for i in range(4):
        memory.record("k", f"r{i}", vectors[i])
    found = mirror.nearest("k", vectors[2])
    assert memory.receipt_of(found.row) == "r2" and found.similarity > 0.999 and found.searched == 4
    for i in range(4, 10):  # followed row by row; the copy keeps the newest six, as the store does
        memory.record("k", f"r{i}", vectors[i])
    assert memory.receipt_of(mirror.nearest("k", vectors[9]).row) == "r9"
    assert len(mirror.view("k")) == 6
    gone = mirror.nearest("k", vectors[1])  # dropped: its nearest is another output, far off
    assert gone.similarity < 0.5 and memory.receipt_of(gone.row) != "r1"
    memory.purge("k")
    memory.record("k", "fresh", vectors[1])
    assert mirror.nearest("k", vectors[1]).searched == 1  # the purge seen: loaded again
    store.close()


def test_the_search_widens_as_the_copy_grows():
    """A fixed expansion finds a paraphrase's source among 10^4 outputs, not among 10^6 (db.semantic_memory)."""
    assert expansion_for(1) == expansion_for(10_000) == EXPANSION_SEARCH
    assert expansion_for(100_000) >= 4 * EXPANSION_SEARCH and expansion_for(1_000_000) >= 16 * EXPANSION_SEARCH
    copy = KeyVectors(keep=20_000)
    vectors = random_vectors(12_000, seed=6)
    copy.add([(i + 1, v.tobytes()) for i, v in enumerate(vectors[:100])])
    assert copy.index.expansion_search == EXPANSION_SEARCH
    copy.add([(i + 1, v.tobytes()) for i, v in enumerate(vectors)])
    assert copy.index.expansion_search == expansion_for(12_000) > EXPANSION_SEARCH
    assert copy.nearest(vectors[11_000]).row == 11_001


def test_a_large_memory_is_loaded_beside_the_requests_not_on_their_path(database_url):
    """Building a worker's index takes about 30 s per 10^5 outputs: a key remembering more than the mirror's
    ``background_above`` is loaded by a thread, and the verdicts asked meanwhile get no fact instead of waiting
    (and holding the worker's lock) for the build. A small one is loaded in place, as before."""
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    vectors = random_vectors(40, seed=5)
    for i, vector in enumerate(vectors):
        memory.record("big", f"b{i}", vector)
    for i, vector in enumerate(vectors[:3]):
        memory.record("small", f"s{i}", vector)
    mirror = VectorMirror(memory, sync_seconds=0.0, background_above=10)
    assert mirror.nearest("big", vectors[7]) is None  # not built on this call's path
    assert memory.receipt_of(mirror.nearest("small", vectors[2]).row) == "s2"  # small: in place
    assert mirror.wait_loaded("big", timeout=30.0)
    found = mirror.nearest("big", vectors[7])
    assert memory.receipt_of(found.row) == "b7" and found.searched == 40
    memory.purge("big")  # the copy is dropped at once and the store's rows loaded again, beside the requests
    for i, vector in enumerate(vectors[:20]):
        memory.record("big", f"c{i}", vector)
    assert mirror.nearest("big", vectors[7]) is None
    assert mirror.wait_loaded("big", timeout=30.0)
    assert memory.receipt_of(mirror.nearest("big", vectors[7]).row) == "c7"
    store.close()


def test_retiring_a_key_with_purge_deletes_its_remembered_meaning(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROVMARK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    for argv in (["create", "alpha"], ["create", "beta"], ["create", "gamma"], ["rotate", "gamma"]):
        assert main(["keys", *argv]) == 0
    store = Store()
    memory = SemanticMemory(store)
    for i, vector in enumerate(random_vectors(3)):
        for key in ("alpha", "beta", "gamma"):
            memory.record(key, f"{key}{i}", vector)
    assert main(["keys", "retire", "beta"]) == 0  # retired, its secret kept for audits: its memory too
    assert main(["keys", "retire", "alpha", "--purge"]) == 0
    assert (memory.count("alpha"), memory.count("beta"), memory.count("gamma")) == (0, 3, 3)
    capsys.readouterr()
    store.close()
