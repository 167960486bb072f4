"""What the generation service wrote under each key, as its words' keyed signatures: one row per output (no text).

The generation service records, when it issues an output's receipt, the output's signature (``db.passage_signature``:
its word stems as 32-bit hashes under a key the master key derives, with their counts) with the receipt's id in
``output_vectors``; the detector asks which remembered output of a tested key a text restates
(``paraphrase_of_own_output``). Shared by every worker of both services through the store, on SQLite and PostgreSQL
alike.

Retention is per key: the newest ``keep`` outputs (PROVMARK_SEMANTIC_OUTPUTS; 0 turns the memory off, nothing
is written and nothing looked up); older rows are deleted as new ones land (every PRUNE_EVERY records of a
writer), and ``purge`` deletes a key's rows (``provmark keys retire --purge``).

A detector worker does not query the store per verdict: ``SignatureMirror`` keeps each key's signatures in an
inverted index in the process (``db.signature_index``), loaded once and then following the key's new rows at most
every SYNC_SECONDS, as ``db.output_memory.MemoryMirror`` follows ``key_outputs``; a purge (the key's oldest row
newer than the copy's) makes it load again. Row ids are never reused (AUTOINCREMENT on SQLite, a sequence on
PostgreSQL).
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import delete, func, select

from db.passage_signature import StemKey, parse
from db.rows import OutputVectorRow, utc_now
from db.signature_index import Scored, SignatureIndex
from db.store import Store

log = logging.getLogger(__name__)

DEFAULT_KEEP = 1_000_000  # outputs per key whose words are remembered (PROVMARK_SEMANTIC_OUTPUTS)
PRUNE_EVERY = 1_000  # records of one writer between two deletions of the rows past ``keep``
SYNC_SECONDS = 1.0  # how stale a detector worker's copy may be
LOOK_BACK = 256  # rows a copy looks back past the newest it read (PostgreSQL may commit ids out of order)
LOAD_CHUNK = 20_000  # rows per query when a copy loads
# a key remembering more outputs than this is loaded into a worker's copy by a thread, beside the requests: the
# index takes about 1 s to build per 10^5 outputs on 2 cores (benchmarks/semantic_memory.py), which on a request's
# path would hold the worker; its verdicts carry no paraphrase fact until the copy is ready
LOAD_IN_BACKGROUND = 20_000
_SIGNED = OutputVectorRow.signature.is_not(None)


class SemanticMemory:
    """``record`` for the generation service, ``rows_since`` / ``receipt_of`` for the detector's copies."""

    def __init__(self, store: Store, keep: int = DEFAULT_KEEP, prune_every: int = PRUNE_EVERY) -> None:
        if keep < 0 or prune_every < 1:
            raise ValueError(f"keep >= 0 and prune_every >= 1 expected, got {keep}, {prune_every}")
        self.store = store
        self.keep = keep
        self.prune_every = prune_every
        self._recorded = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.keep > 0

    def record(self, key_id: str, receipt_id: str, signature: bytes) -> None:
        """One output's words' signature (``db.passage_signature.signature``) under ``key_id``; nothing when the
        memory is off. Every PRUNE_EVERY records the key's rows past the newest ``keep`` are deleted."""
        if not self.enabled:
            return
        if not isinstance(signature, bytes):
            raise ValueError(f"signature: expected bytes, got {type(signature).__name__}")
        with self._lock:
            prune = self._recorded % self.prune_every == 0
            self._recorded += 1
        with self.store.write() as session:
            session.add(OutputVectorRow(key_id=key_id, receipt_id=receipt_id, created_at=utc_now(),
                                        signature=signature))
        if prune:
            self.prune(key_id)

    def prune(self, key_id: str) -> int:
        """Delete the key's rows past its newest ``keep``; how many were deleted."""
        with self.store.write() as session:
            cutoff = session.scalar(select(OutputVectorRow.id).where(OutputVectorRow.key_id == key_id)
                                    .order_by(OutputVectorRow.id.desc()).offset(self.keep).limit(1))
            if cutoff is None:
                return 0
            return session.execute(delete(OutputVectorRow).where(
                OutputVectorRow.key_id == key_id, OutputVectorRow.id <= cutoff)).rowcount

    def purge(self, key_id: str) -> int:
        """Delete every remembered output of ``key_id``; how many were deleted."""
        with self.store.write() as session:
            return session.execute(delete(OutputVectorRow).where(OutputVectorRow.key_id == key_id)).rowcount

    def count(self, key_id: str) -> int:
        """The key's remembered outputs that have a signature (rows from before revision 0013 have none); so
        below."""
        with self.store.read() as session:
            return int(session.scalar(select(func.count()).select_from(OutputVectorRow)
                                      .where(OutputVectorRow.key_id == key_id, _SIGNED)))

    def oldest_id(self, key_id: str) -> int | None:
        """The id of the key's oldest remembered row (None: none)."""
        with self.store.read() as session:
            return session.scalar(select(func.min(OutputVectorRow.id)).where(OutputVectorRow.key_id == key_id,
                                                                             _SIGNED))

    def rows_since(self, key_id: str, after: int, limit: int | None = None) -> list[tuple[int, bytes]]:
        """(id, signature) of the key's rows with id > ``after`` that have one, oldest first (at most ``limit``)."""
        with self.store.read() as session:
            rows = session.execute(select(OutputVectorRow.id, OutputVectorRow.signature).where(
                OutputVectorRow.key_id == key_id, _SIGNED, OutputVectorRow.id > after)
                .order_by(OutputVectorRow.id).limit(limit)).all()
        return [(int(i), bytes(v)) for i, v in rows]

    def newest_rows(self, key_id: str, limit: int) -> list[tuple[int, bytes]]:
        """(id, signature) of the key's newest ``limit`` rows that have one, oldest first, read in chunks of
        LOAD_CHUNK."""
        out: list[tuple[int, bytes]] = []
        before = None
        while len(out) < limit:
            with self.store.read() as session:
                query = select(OutputVectorRow.id, OutputVectorRow.signature).where(OutputVectorRow.key_id == key_id,
                                                                                     _SIGNED)
                if before is not None:
                    query = query.where(OutputVectorRow.id < before)
                rows = session.execute(query.order_by(OutputVectorRow.id.desc())
                                       .limit(min(LOAD_CHUNK, limit - len(out)))).all()
            if not rows:
                break
            out += [(int(i), bytes(v)) for i, v in rows]
            before = rows[-1][0]
        out.reverse()
        return out

    def signatures_of(self, row_ids: list[int]) -> dict[int, bytes]:
        """The stored signatures of these rows (rows gone, or from before signatures, are left out)."""
        if not row_ids:
            return {}
        with self.store.read() as session:
            rows = session.execute(select(OutputVectorRow.id, OutputVectorRow.signature).where(
                OutputVectorRow.id.in_(sorted(set(row_ids))), OutputVectorRow.signature.is_not(None))).all()
        return {int(i): bytes(blob) for i, blob in rows}

    def receipt_of(self, row_id: int) -> str | None:
        """The receipt id one remembered output was issued with (None once its row is gone)."""
        with self.store.read() as session:
            return session.scalar(select(OutputVectorRow.receipt_id).where(OutputVectorRow.id == row_id))


class SignatureMirror:
    """Each key's signatures in this process (``view``), for the detector's ``paraphrase_of_own_output``: as the
    store had them at most ``sync_seconds`` ago. A key with more than ``background_above`` remembered outputs is
    loaded by a thread, and so again after a purge; until it is ready its ``view`` is None. The signatures are read
    with the ``StemKey`` the first ``view`` of a key passes (one per process: the master key's)."""

    def __init__(self, memory: SemanticMemory, sync_seconds: float = SYNC_SECONDS,
                 background_above: int = LOAD_IN_BACKGROUND) -> None:
        self.memory = memory
        self.sync_seconds = sync_seconds
        self.background_above = background_above
        self._keys: dict[str, SignatureIndex] = {}
        self._loading: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.memory.enabled

    def view(self, key_id: str, key: StemKey) -> SignatureIndex | None:
        """The key's copy, followed to the store's newest rows; None while a large copy is being loaded."""
        with self._lock:
            copy = self._keys.get(key_id)
            if copy is None:
                return self._start_loading(key_id, key)
            if time.monotonic() - copy.synced_at >= self.sync_seconds:
                oldest = self.memory.oldest_id(key_id)
                # purged: rows the copy holds are gone past what retention deletes (the store keeps at least the
                # newest ``keep``, the copy exactly those)
                held = copy.oldest()
                if held is not None and (oldest is None or held < oldest):
                    del self._keys[key_id]
                    return self._start_loading(key_id, key)
                fresh = [(i, blob) for i, blob in self.memory.rows_since(key_id, copy.newest - LOOK_BACK)
                         if i not in copy.seen]  # the look-back reads rows held already: not parsed again
                copy.add(_parsed(fresh, key), LOOK_BACK)
                copy.synced_at = time.monotonic()
            return copy

    def best(self, key_id: str, query, key: StemKey, count: int = 1) -> Scored | None:
        """``SignatureIndex.best`` on the key's copy; None while it is loading."""
        copy = self.view(key_id, key)
        return None if copy is None else copy.best(query, count)

    def wait_loaded(self, key_id: str, key: StemKey, timeout: float | None = None) -> bool:
        """Start loading the key's copy if it is not held, wait up to ``timeout`` s for it; whether it is ready."""
        self.view(key_id, key)
        with self._lock:
            thread = self._loading.get(key_id)
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            return key_id in self._keys

    def _start_loading(self, key_id: str, key: StemKey) -> SignatureIndex | None:
        """Under the lock: a small key's copy is made here; a large one's by a thread (None meanwhile)."""
        if key_id in self._loading:
            return None
        if self.memory.count(key_id) <= self.background_above:
            copy = self._keys[key_id] = self._load(key_id, key)
            return copy
        thread = threading.Thread(target=self._load_beside, args=(key_id, key), name=f"semantic-load-{key_id}",
                                  daemon=True)
        self._loading[key_id] = thread
        thread.start()
        return None

    def _load_beside(self, key_id: str, key: StemKey) -> None:
        copy = None
        try:
            copy = self._load(key_id, key)
        except Exception:  # noqa: BLE001 (a store error: logged, and the next verdict starts a new load)
            log.exception("semantic memory: loading key %s's copy failed", key_id)
        finally:
            with self._lock:
                self._loading.pop(key_id, None)
                if copy is not None:
                    self._keys[key_id] = copy

    def _load(self, key_id: str, key: StemKey) -> SignatureIndex:
        copy = SignatureIndex(self.memory.keep)
        copy.add(_parsed(self.memory.newest_rows(key_id, self.memory.keep), key), LOOK_BACK)
        return copy


def _parsed(rows: list[tuple[int, bytes]], key: StemKey) -> list[tuple[int, object]]:
    return [(i, parse(blob, key)) for i, blob in rows]
