"""db.semantic_memory and db.signature_index on both backends (a SQLite file and a real PostgreSQL server): what a
row holds (a keyed signature and a receipt id: no text, no vector), retention of the newest N per key, purge with
the key, the memory turned off, a detector worker's copy (``SignatureMirror``) following new rows and a purge, and
the inverted index's similarities equal to the exact cosines."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from sqlalchemy import inspect, select, text

from api.cli.main import main
from db.passage_signature import COUNT, HASH, parse, similarity, stem_key
from db.passage_words import fitted_words
from db.rows import OutputVectorRow
from db.semantic_memory import SemanticMemory, SignatureMirror
from db.signature_index import SignatureIndex
from db.store import Store

pytest_plugins = ["pg"]

TEXT = "The city council voted on Tuesday night to close the old public library on Main Street."
KEY = stem_key(hashlib.sha256(b"provmark-test/semantic").digest(), fitted_words())


def random_signatures(count: int, seed: int = 0, stems: int = 40, vocabulary: int = 5_000) -> list[bytes]:
    """Signatures of ``count`` random texts of about ``stems`` stems drawn from ``vocabulary`` hashes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        hashes = np.unique(rng.integers(1, vocabulary, stems)).astype(HASH)
        out.append(hashes.tobytes() + rng.integers(1, 4, len(hashes)).astype(COUNT).tobytes())
    return out


def noisy(blob: bytes, seed: int, keep: float = 0.6) -> bytes:
    """A paraphrase's signature: ``keep`` of the stems, and as many new ones."""
    rng = np.random.default_rng(seed)
    hashes = np.frombuffer(blob, dtype=HASH, count=len(blob) // 5)
    kept = hashes[rng.random(len(hashes)) < keep]
    fresh = np.unique(np.concatenate([kept, rng.integers(10**6, 2 * 10**6, len(hashes) - len(kept))])).astype(HASH)
    return fresh.tobytes() + np.ones(len(fresh), COUNT).tobytes()


def test_a_row_holds_a_signature_and_a_receipt_no_text(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    blob = random_signatures(1)[0]
    memory.record("k", "receipt-1", blob)
    columns = {c["name"] for c in inspect(store.engine).get_columns("output_vectors")}
    assert columns == {"id", "key_id", "receipt_id", "created_at", "vector", "form", "signature"}
    with store.read() as session:
        row = session.scalars(select(OutputVectorRow)).one()
    assert row.vector is None and row.signature == blob and TEXT.encode() not in row.signature
    assert memory.signatures_of([row.id, row.id + 1]) == {row.id: blob} and memory.receipt_of(row.id) == "receipt-1"
    with pytest.raises(ValueError, match="bytes"):
        memory.record("k", "receipt-2", np.zeros(4, np.int8))
    store.close()


def test_the_migration_keeps_row_ids_never_reused_on_sqlite(tmp_path):
    """Revision 0014 lets the vector column be empty; SQLite alters it by copying the table, which must keep its
    AUTOINCREMENT (a deleted newest id is not given again: a worker's copy tells a purge from new rows by ids)."""
    store = Store(url=f"sqlite:///{tmp_path / 'store.db'}")
    store.upgrade()
    with store.read() as session:
        created = session.execute(text("SELECT sql FROM sqlite_master WHERE name = 'output_vectors'")).scalar_one()
    assert "AUTOINCREMENT" in created.upper()
    memory = SemanticMemory(store)
    memory.record("k", "a", b"\x01\x00\x00\x00\x01")
    first = memory.newest_rows("k", 1)[0][0]
    memory.purge("k")
    memory.record("k", "b", b"\x01\x00\x00\x00\x01")
    assert memory.newest_rows("k", 1)[0][0] > first
    store.close()


def test_rows_without_a_signature_are_not_loaded_or_counted(database_url):
    """A row from before revision 0013 has a vector and no signature: a copy neither loads it nor follows it, and
    the key's count leaves it out."""
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    old, new = random_signatures(2, seed=1)
    memory.record("k", "receipt-new", new)
    with store.write() as session:
        session.add(OutputVectorRow(key_id="k", receipt_id="receipt-old", vector=bytes(512), form=3))
    assert memory.count("k") == 1
    mirror = SignatureMirror(memory, sync_seconds=0.0)
    found = mirror.best("k", parse(new, KEY), KEY)
    assert found.searched == 1 and memory.receipt_of(int(found.ids[0])) == "receipt-new"
    memory.record("k", "receipt-newer", old)
    found = mirror.best("k", parse(old, KEY), KEY)
    assert memory.receipt_of(int(found.ids[0])) == "receipt-newer" and len(mirror.view("k", KEY)) == 2
    store.close()


def test_retention_keeps_the_newest_per_key_and_purge_deletes_the_key(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store, keep=5, prune_every=1)
    blobs = random_signatures(12)
    for i, blob in enumerate(blobs):
        memory.record("k", f"r{i}", blob)
    memory.record("other", "o0", blobs[0])
    assert memory.count("k") == 5 and memory.count("other") == 1
    kept = memory.newest_rows("k", 100)
    assert [memory.receipt_of(i) for i, _ in kept] == [f"r{i}" for i in range(7, 12)]  # the newest five
    assert memory.purge("k") == 5 and memory.count("k") == 0 and memory.count("other") == 1
    off = SemanticMemory(store, keep=0)
    off.record("k", "ignored", blobs[0])
    assert not off.enabled and memory.count("k") == 0
    store.close()


def test_the_mirror_follows_new_outputs_drops_old_ones_and_reloads_after_a_purge(database_url):
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store, keep=6, prune_every=1)
    mirror = SignatureMirror(memory, sync_seconds=0.0)
    blobs = random_signatures(10, seed=3)
    assert mirror.best("k", parse(blobs[0], KEY), KEY) is not None and len(mirror.view("k", KEY)) == 0
    for i in range(4):
        memory.record("k", f"r{i}", blobs[i])
    found = mirror.best("k", parse(blobs[2], KEY), KEY)
    assert memory.receipt_of(int(found.ids[0])) == "r2" and found.similarities[0] > 0.999 and found.searched == 4
    for i in range(4, 10):  # followed row by row; the copy keeps the newest six, as the store does
        memory.record("k", f"r{i}", blobs[i])
    assert memory.receipt_of(int(mirror.best("k", parse(blobs[9], KEY), KEY).ids[0])) == "r9"
    assert len(mirror.view("k", KEY)) == 6
    gone = mirror.best("k", parse(blobs[1], KEY), KEY)  # dropped: its closest is another output, far off
    assert gone.similarities[0] < 0.5 and memory.receipt_of(int(gone.ids[0])) != "r1"
    memory.purge("k")
    memory.record("k", "fresh", blobs[1])
    assert mirror.best("k", parse(blobs[1], KEY), KEY).searched == 1  # the purge seen: loaded again
    store.close()


def test_the_index_gives_the_exact_cosines_across_segments_and_retention():
    """Rows added in batches (segments merged as they come), the oldest past ``keep`` left out: every lookup's best
    is the brute-force best among the rows kept, at the exact cosine."""
    blobs = random_signatures(3_000, seed=7, stems=60, vocabulary=3_000)
    parsed = [parse(b, KEY) for b in blobs]
    index = SignatureIndex(keep=2_000)
    for start in range(0, 3_000, 250):
        index.add([(i + 1, parsed[i]) for i in range(start, start + 250)])
    assert len(index) == 2_000 and index.oldest() == 1_001 and len(index.segments) < 8
    for q in np.random.default_rng(8).integers(0, 3_000, 25):
        query = parse(noisy(blobs[q], int(q)), KEY)
        found = index.best(query, 4)
        brute = max((similarity(query, parsed[j]), j + 1) for j in range(1_000, 3_000))
        assert found.exact and found.searched == 2_000 and int(found.ids[0]) > 1_000
        assert abs(found.similarities[0] - brute[0]) < 1e-5  # the best (a tie, to float32 rounding, may be another)
        assert abs(similarity(query, parsed[int(found.ids[0]) - 1]) - brute[0]) < 1e-5
        assert q < 1_000 or int(found.ids[0]) == q + 1  # a kept row's paraphrase finds it
    index.add([(i + 1, parsed[i]) for i in range(2_900, 3_000)])  # read again (a sync's look-back): one row each
    assert len(index) == 2_000


def test_wide_and_narrow_postings_give_the_same_lookups(monkeypatch):
    """Postings of 2 bytes (segments of at most NARROW_ROWS outputs) and of 4 (larger ones), merged into each
    other as segments grow: the same best rows and similarities."""
    from db import signature_index  # noqa: PLC0415 (this test only)

    blobs = random_signatures(1_200, seed=12, stems=40, vocabulary=1_500)
    parsed = [parse(b, KEY) for b in blobs]
    found = {}
    for narrow in (1 << 16, 300):  # 300: the first segments narrow, the merged ones wide
        monkeypatch.setattr(signature_index, "NARROW_ROWS", narrow)
        index = SignatureIndex(keep=1_000)
        for start in range(0, 1_200, 200):
            index.add([(i + 1, parsed[i]) for i in range(start, start + 200)])
        kinds = {s.rows.dtype.name for s in index.segments}
        assert "int32" in kinds if narrow == 300 else kinds == {"uint16"}
        found[narrow] = [index.best(parse(noisy(blobs[q], q), KEY), 4) for q in range(200, 1_200, 50)]
    for wide, narrow in zip(found[300], found[1 << 16]):
        assert wide.ids.tolist() == narrow.ids.tolist() and np.allclose(wide.similarities, narrow.similarities)


def test_a_lookup_past_its_postings_budget_keeps_the_source_among_its_candidates():
    """Against many outputs a long text reads only its rarest stems' postings (db.signature_index.MAX_POSTINGS):
    the similarities are partial then, and a paraphrase's source is still among the candidates compared exactly."""
    blobs = random_signatures(4_000, seed=9, stems=80, vocabulary=2_000)
    index = SignatureIndex(keep=10_000)
    index.add([(i + 1, parse(b, KEY)) for i, b in enumerate(blobs)])
    for q in range(0, 4_000, 400):
        found = index.best(parse(noisy(blobs[q], q), KEY), 16, max_postings=2_000)
        assert not found.exact and q + 1 in found.ids.tolist()


def test_a_large_memory_is_loaded_beside_the_requests_not_on_their_path(database_url):
    """A key remembering more than the mirror's ``background_above`` is loaded by a thread, and the verdicts asked
    meanwhile get no fact instead of waiting (and holding the worker's lock) for the build. A small one is loaded
    in place, as before."""
    store = Store(url=database_url)
    store.upgrade()
    memory = SemanticMemory(store)
    blobs = random_signatures(40, seed=5)
    for i, blob in enumerate(blobs):
        memory.record("big", f"b{i}", blob)
    for i, blob in enumerate(blobs[:3]):
        memory.record("small", f"s{i}", blob)
    mirror = SignatureMirror(memory, sync_seconds=0.0, background_above=10)
    assert mirror.best("big", parse(blobs[7], KEY), KEY) is None  # not built on this call's path
    assert memory.receipt_of(int(mirror.best("small", parse(blobs[2], KEY), KEY).ids[0])) == "s2"  # in place
    assert mirror.wait_loaded("big", KEY, timeout=30.0)
    found = mirror.best("big", parse(blobs[7], KEY), KEY)
    assert memory.receipt_of(int(found.ids[0])) == "b7" and found.searched == 40
    memory.purge("big")  # the copy is dropped at once and the store's rows loaded again, beside the requests
    for i, blob in enumerate(blobs[:20]):
        memory.record("big", f"c{i}", blob)
    assert mirror.best("big", parse(blobs[7], KEY), KEY) is None
    assert mirror.wait_loaded("big", KEY, timeout=30.0)
    assert memory.receipt_of(int(mirror.best("big", parse(blobs[7], KEY), KEY).ids[0])) == "c7"
    store.close()


def test_retiring_a_key_with_purge_deletes_its_remembered_words(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PROVMARK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    for argv in (["create", "alpha"], ["create", "beta"], ["create", "gamma"], ["rotate", "gamma"]):
        assert main(["keys", *argv]) == 0
    store = Store()
    memory = SemanticMemory(store)
    for i, blob in enumerate(random_signatures(3)):
        for key in ("alpha", "beta", "gamma"):
            memory.record(key, f"{key}{i}", blob)
    assert main(["keys", "retire", "beta"]) == 0  # retired, its secret kept for audits: its memory too
    assert main(["keys", "retire", "alpha", "--purge"]) == 0
    assert (memory.count("alpha"), memory.count("beta"), memory.count("gamma")) == (0, 3, 3)
    capsys.readouterr()
    store.close()


def test_the_index_kernel_and_numpy_give_the_same_scores():
    """``segment_scores`` in C and in numpy (no compiler, or PROVMARK_NATIVE=0): the same scores, to float32
    rounding, with every stem read and past the postings budget (the same stems chosen)."""
    from db import signature_index  # noqa: PLC0415 (this test only)

    assert signature_index._library() is not None  # the kernel is what is checked (CI has a compiler)
    blobs = random_signatures(500, seed=11, stems=50, vocabulary=1_500)
    index = SignatureIndex(keep=1_000)
    index.add([(i + 1, parse(b, KEY)) for i, b in enumerate(blobs)])
    segment = index.segments[0]
    for q in (3, 77, 250):
        query = parse(noisy(blobs[q], q), KEY)
        hashes = query.hashes.astype(np.uint32)
        products = (query.weights * query.weights / query.scale).astype(np.float32)
        for budget in (10**9, 300):
            native = signature_index.segment_scores(segment, hashes, products, budget)
            python = signature_index.segment_scores(segment, hashes, products, budget, native=False)
            assert native[1:] == python[1:] and native[2] == (budget > 10**6)
            assert np.allclose(native[0], python[0], atol=1e-6) and native[0].max() > 0
