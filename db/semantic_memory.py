"""The meaning of what the generation service wrote under each key: one passage vector per output (no text).

The generation service records, when it issues an output's receipt, the output's vector (``db.passage_vectors``:
a keyed rotation of its WordLlama embedding, int8) with the receipt's id in ``output_vectors``; the detector asks
which remembered output of a tested key a text is closest to in meaning (``paraphrase_of_own_output``). Shared
by every worker of both services through the store, on SQLite and PostgreSQL alike.

Retention is per key: the newest ``keep`` outputs (PROVMARK_SEMANTIC_OUTPUTS; 0 turns the memory off, nothing
is written and nothing looked up); older rows are deleted as new ones land (every PRUNE_EVERY records of a
writer), and ``purge`` deletes a key's rows (``provmark keys retire --purge``).

A detector worker does not query the store per verdict: ``VectorMirror`` keeps each key's vectors in an
approximate-nearest-neighbour index in the process (``usearch``: HNSW over int8 vectors, cosine), loaded once
and then following the key's new rows at most every SYNC_SECONDS, as ``db.output_memory.MemoryMirror`` follows
``key_outputs``; a purge (the key's oldest row newer than the copy's) makes it load again. Row ids are never
reused (AUTOINCREMENT on SQLite, a sequence on PostgreSQL).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from dataclasses import dataclass

import numpy as np
from sqlalchemy import delete, func, select

from db.passage_vectors import DIM, FORM
from db.rows import OutputVectorRow, utc_now
from db.store import Store

log = logging.getLogger(__name__)

DEFAULT_KEEP = 1_000_000  # outputs per key whose meaning is remembered (PROVMARK_SEMANTIC_OUTPUTS)
PRUNE_EVERY = 1_000  # records of one writer between two deletions of the rows past ``keep``
SYNC_SECONDS = 1.0  # how stale a detector worker's copy may be
LOOK_BACK = 256  # rows a copy looks back past the newest it read (PostgreSQL may commit ids out of order)
EXACT_BELOW = 2_000  # a copy this small is searched exhaustively (exact, and as fast as the graph there)
LOAD_CHUNK = 20_000  # rows per query when a copy loads
# a key remembering more outputs than this is loaded into a worker's copy by a thread, beside the requests: the
# index takes about 1 s to build per 10^4 outputs and 30 s per 10^5 on 2 cores (benchmarks/semantic_memory.py),
# which on a request's path would hold the worker; its verdicts carry no paraphrase fact until the copy is ready
LOAD_IN_BACKGROUND = 5_000
CONNECTIVITY = 16  # HNSW: graph degree (memory per output and recall)
# HNSW: candidates kept while searching, grown with the copy (recall against time). On random vectors, the graph's
# hardest case, a noisy copy's source is found first (recall at 1) at 64 in 0.999 of lookups among 10^4 outputs
# but 0.79 among 10^5 (0.99 at 256) and 0.21 among 10^6 (benchmarks/semantic_memory.py)
EXPANSION_SEARCH = 64
EXPANSION_AT = 10_000  # the copy size up to which EXPANSION_SEARCH is enough; past it, 4 times as wide per decade


def expansion_for(size: int) -> int:
    """The search expansion for a copy of ``size`` outputs: 64 up to 10^4, 256 at 10^5 and 1,024 at 10^6."""
    if size <= EXPANSION_AT:
        return EXPANSION_SEARCH
    return int(round(EXPANSION_SEARCH * 4.0 ** math.log10(size / EXPANSION_AT)))


@dataclass(frozen=True, slots=True)
class Nearest:
    """The remembered output closest in meaning to a text: its row (``output_vectors.id``), cosine similarity,
    and how many of the key's outputs were searched."""

    row: int
    similarity: float
    searched: int


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

    def record(self, key_id: str, receipt_id: str, vector: np.ndarray, signature: bytes | None = None) -> None:
        """One output's vector (int8 [DIM], ``db.passage_vectors.stored_vector``) and words' signature
        (``db.passage_signature.signature``) under ``key_id``; nothing when the memory is off. Every PRUNE_EVERY
        records the key's rows past the newest ``keep`` are deleted."""
        if not self.enabled:
            return
        vector = np.asarray(vector)
        if vector.dtype != np.int8 or vector.shape != (DIM,):
            raise ValueError(f"vector: expected int8 [{DIM}], got {vector.dtype} {list(vector.shape)}")
        with self._lock:
            prune = self._recorded % self.prune_every == 0
            self._recorded += 1
        with self.store.write() as session:
            session.add(OutputVectorRow(key_id=key_id, receipt_id=receipt_id, created_at=utc_now(),
                                        vector=vector.tobytes(), signature=signature))
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
        """Delete every remembered vector of ``key_id``; how many were deleted."""
        with self.store.write() as session:
            return session.execute(delete(OutputVectorRow).where(OutputVectorRow.key_id == key_id)).rowcount

    def count(self, key_id: str) -> int:
        """The key's remembered outputs of the current form (``db.passage_vectors.FORM``); so below."""
        with self.store.read() as session:
            return int(session.scalar(select(func.count()).select_from(OutputVectorRow)
                                      .where(OutputVectorRow.key_id == key_id, OutputVectorRow.form == FORM)))

    def oldest_id(self, key_id: str) -> int | None:
        """The id of the key's oldest remembered row (None: none)."""
        with self.store.read() as session:
            return session.scalar(select(func.min(OutputVectorRow.id)).where(OutputVectorRow.key_id == key_id,
                                                                             OutputVectorRow.form == FORM))

    def rows_since(self, key_id: str, after: int, limit: int | None = None) -> list[tuple[int, bytes]]:
        """(id, vector bytes) of the key's rows with id > ``after``, oldest first (at most ``limit``)."""
        with self.store.read() as session:
            rows = session.execute(select(OutputVectorRow.id, OutputVectorRow.vector).where(
                OutputVectorRow.key_id == key_id, OutputVectorRow.form == FORM, OutputVectorRow.id > after)
                .order_by(OutputVectorRow.id).limit(limit)).all()
        return [(int(i), v) for i, v in rows]

    def newest_rows(self, key_id: str, limit: int) -> list[tuple[int, bytes]]:
        """(id, vector bytes) of the key's newest ``limit`` rows, oldest first, read in chunks of LOAD_CHUNK."""
        out: list[tuple[int, bytes]] = []
        before = None
        while len(out) < limit:
            with self.store.read() as session:
                query = select(OutputVectorRow.id, OutputVectorRow.vector).where(OutputVectorRow.key_id == key_id,
                                                                                  OutputVectorRow.form == FORM)
                if before is not None:
                    query = query.where(OutputVectorRow.id < before)
                rows = session.execute(query.order_by(OutputVectorRow.id.desc())
                                       .limit(min(LOAD_CHUNK, limit - len(out)))).all()
            if not rows:
                break
            out += [(int(i), v) for i, v in rows]
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


class KeyVectors:
    """One key's vectors as a detector worker holds them: an HNSW index (``usearch``) keyed by row id, the newest
    ``keep`` of them (older ones removed as new ones arrive)."""

    def __init__(self, keep: int) -> None:
        from usearch.index import Index  # noqa: PLC0415 (a compiled library: loaded by the first copy made)

        self.keep = keep
        self.index = Index(ndim=DIM, metric="cos", dtype="i8", connectivity=CONNECTIVITY,
                           expansion_search=EXPANSION_SEARCH)
        self.order: collections.deque[int] = collections.deque()  # row ids held, oldest first
        self.newest = 0
        self.seen: set[int] = set()  # row ids within LOOK_BACK of ``newest`` already added
        self.synced_at = time.monotonic()

    def add(self, rows: list[tuple[int, bytes]]) -> None:
        """Add ``rows`` (id, vector bytes) not added before; drop the oldest past ``keep``."""
        rows = [(i, v) for i, v in rows if i not in self.seen]
        if not rows:
            return
        ids = np.fromiter((i for i, _ in rows), dtype=np.uint64, count=len(rows))
        vectors = np.frombuffer(b"".join(v for _, v in rows), dtype=np.int8).reshape(len(rows), DIM)
        self.index.add(ids, vectors, threads=1 if len(rows) < 1_000 else 0)
        self.order.extend(int(i) for i in ids)
        self.seen.update(int(i) for i in ids)
        self.newest = max(self.newest, int(ids.max()))
        self.seen = {i for i in self.seen if i > self.newest - LOOK_BACK}
        excess = len(self.order) - self.keep
        if excess > 0:
            dropped = [self.order.popleft() for _ in range(excess)]
            self.index.remove(np.asarray(dropped, dtype=np.uint64))
        expansion = expansion_for(len(self.order))
        if self.index.expansion_search != expansion:
            self.index.expansion_search = expansion

    def __len__(self) -> int:
        return len(self.order)

    def nearest(self, vector: np.ndarray) -> Nearest | None:
        """The held output closest to ``vector`` (int8 [DIM]); None while nothing is held."""
        found = self.candidates(vector, 1)
        return found[0] if found else None

    def candidates(self, vector: np.ndarray, count: int) -> list[Nearest]:
        """The ``count`` held outputs closest to ``vector`` (int8 [DIM]), closest first; [] while nothing is held."""
        size = len(self.order)
        if not size:
            return []
        # one thread: usearch's default (every core) starts a pool per call, 0.1-0.3 ms of a single lookup
        found = self.index.search(np.asarray(vector, dtype=np.int8), count, exact=size < EXACT_BELOW, threads=1)
        return [Nearest(int(key), float(1.0 - distance), size) for key, distance in zip(found.keys, found.distances)]

    def memory_bytes(self) -> int:
        return int(self.index.memory_usage)


class VectorMirror:
    """Each key's vectors in this process (``view``), for the detector's ``paraphrase_of_own_output``: as the store
    had them at most ``sync_seconds`` ago. A key with more than ``background_above`` remembered outputs is loaded
    by a thread, and so again after a purge; until it is ready its ``view`` is None."""

    def __init__(self, memory: SemanticMemory, sync_seconds: float = SYNC_SECONDS,
                 background_above: int = LOAD_IN_BACKGROUND) -> None:
        self.memory = memory
        self.sync_seconds = sync_seconds
        self.background_above = background_above
        self._keys: dict[str, KeyVectors] = {}
        self._loading: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.memory.enabled

    def view(self, key_id: str) -> KeyVectors | None:
        """The key's copy, followed to the store's newest rows; None while a large copy is being loaded."""
        with self._lock:
            copy = self._keys.get(key_id)
            if copy is None:
                return self._start_loading(key_id)
            if time.monotonic() - copy.synced_at >= self.sync_seconds:
                oldest = self.memory.oldest_id(key_id)
                # purged: rows the copy holds are gone past what retention deletes (the store keeps at least the
                # newest ``keep``, the copy exactly those)
                if copy.order and (oldest is None or copy.order[0] < oldest):
                    del self._keys[key_id]
                    return self._start_loading(key_id)
                copy.add(self.memory.rows_since(key_id, copy.newest - LOOK_BACK))
                copy.synced_at = time.monotonic()
            return copy

    def nearest(self, key_id: str, vector: np.ndarray) -> Nearest | None:
        copy = self.view(key_id)
        return None if copy is None else copy.nearest(vector)

    def wait_loaded(self, key_id: str, timeout: float | None = None) -> bool:
        """Start loading the key's copy if it is not held, wait up to ``timeout`` s for it; whether it is ready."""
        self.view(key_id)
        with self._lock:
            thread = self._loading.get(key_id)
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            return key_id in self._keys

    def _start_loading(self, key_id: str) -> KeyVectors | None:
        """Under the lock: a small key's copy is made here; a large one's by a thread (None meanwhile)."""
        if key_id in self._loading:
            return None
        if self.memory.count(key_id) <= self.background_above:
            copy = self._keys[key_id] = self._load(key_id)
            return copy
        thread = threading.Thread(target=self._load_beside, args=(key_id,), name=f"semantic-load-{key_id}",
                                  daemon=True)
        self._loading[key_id] = thread
        thread.start()
        return None

    def _load_beside(self, key_id: str) -> None:
        copy = None
        try:
            copy = self._load(key_id)
        except Exception:  # noqa: BLE001 (a store error: logged, and the next verdict starts a new load)
            log.exception("semantic memory: loading key %s's copy failed", key_id)
        finally:
            with self._lock:
                self._loading.pop(key_id, None)
                if copy is not None:
                    self._keys[key_id] = copy

    def _load(self, key_id: str) -> KeyVectors:
        copy = KeyVectors(self.memory.keep)
        copy.add(self.memory.newest_rows(key_id, self.memory.keep))
        return copy
