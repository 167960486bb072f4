"""What the generation service wrote under each key, as the spoof check needs it.

Per key: in how many watermarked outputs each unit occurred (``output_units``; key-free unit identities,
never text), and one row per output with the spoof z of that output against the counts before it
(``key_outputs``: the check's null, from the WARMUP-th output on: against a nearly empty memory every
unit looks unlearnable and the z of early outputs is not what later ones get). The generation service records
an output when it issues its receipt; the detector service reads both for a verdict that says ``watermarked``
(``detector.spoof_check``). Shared by every worker of both services through the store, on SQLite and PostgreSQL alike (atomic upserts).

A detector worker does not query the store per verdict: ``MemoryMirror`` keeps each key's counts and null in
the process, loaded once from the aggregate and then following the key's new ``key_outputs`` rows (each
holds its output's units), at most every SYNC_SECONDS. A query per positive verdict cost 0.4-0.9 ms, as
much as detecting the text (docs/security.md).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from db.count_table import CountTable
from db.output_grams import GramIndex
from db.rows import KeyOutputRow, OutputUnitRow, utc_now
from db.store import Store

# the null is the key's most recent outputs: genuine z drifts up as the counts grow (1.6 -> 2.1 over 2,000 real
# outputs), and a window of 1,000 keeps the normal fit's flag rates at 1e-3, 1e-2 and 5e-2 nominal where 5,000
# lagged (5 % -> 6.0 %; docs/security.md, evaluation/own_output_null.py)
NULL_WINDOW = 1_000
WARMUP = 40  # outputs remembered before a key's outputs enter its null
CHUNK = 500  # units per IN (...) / upsert statement (SQLite's variable limit, PostgreSQL's plan size)
SYNC_SECONDS = 1.0  # how stale a detector worker's copy of a key's memory may be
# outputs whose units a detector worker keeps at hand (the newest it read, and those verdicts asked for): a
# verdict that recognises one of them checks it without its units, no query (about 1.2 KB each)
UNITS_KEPT = 4096
# rows a copy looks back past the newest it has read: on PostgreSQL an output's id is drawn when its transaction
# starts, so a row may commit after rows with larger ids (SQLite commits one writer at a time, in id order)
LOOK_BACK = 256
# outputs per key whose wording (db.output_grams) a detector worker keeps, the newest (PROVMARK_REMEMBERED_OUTPUTS):
# with 200-token outputs the window's peak (20,000, a quarter over) is a 2^22-slot owner table (67 MB) and the
# n-grams kept for its rebuilds (13 MB) per key and worker, and a rebuild (every 4,000 outputs) takes about 55 ms.
# The store keeps every output's n-grams: a larger window costs only memory
GRAMS_KEPT = 16_000


def as_stored(units: np.ndarray) -> list[int]:
    """uint64 unit identities as the int64 the column holds (the same 64 bits)."""
    return np.ascontiguousarray(units, dtype=np.uint64).view(np.int64).tolist()


def packed(distinct: list[int]) -> bytes:
    """An output's distinct stored identities as ``key_outputs.units`` holds them (little-endian 64-bit)."""
    return np.asarray(distinct, dtype="<i8").tobytes()


_PLACEHOLDERS = {"qmark": "?", "format": "%s", "pyformat": "%s"}  # sqlite3; psycopg


def _counts_statement(paramstyle: str, key_id: str, units: list[int]) -> tuple[str, tuple]:
    """The lookup of ``units``' counts as driver-level SQL with positional parameters (values never
    enter the text); ValueError for a driver whose parameter style is not positional."""
    mark = _PLACEHOLDERS.get(paramstyle)
    if mark is None:
        raise ValueError(f"output memory: unsupported DBAPI parameter style {paramstyle!r}")
    table = OutputUnitRow.__tablename__
    sql = (f"SELECT unit, outputs FROM {table} WHERE key_id = {mark} AND unit IN ({', '.join([mark] * len(units))})")
    return sql, (key_id, *units)


class OutputMemory:
    """``counts_of`` / ``null_of`` for the detector, ``record`` for the generation service."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def counts_of(self, key_id: str, units: np.ndarray) -> np.ndarray:
        """Outputs of ``key_id`` that contained each of ``units`` (0 for a unit never emitted). On every
        positive verdict: the statement goes to the driver as it is (SQLAlchemy's expanding IN and result
        processing took two thirds of the 0.6 ms a 200-token text's lookup cost on SQLite)."""
        stored = as_stored(units)
        found: dict[int, int] = {}
        wanted = sorted(set(stored))
        with self.store.read() as session:
            connection = session.connection()
            for start in range(0, len(wanted), CHUNK):
                chunk = wanted[start:start + CHUNK]
                sql, params = _counts_statement(connection.dialect.paramstyle, key_id, chunk)
                found.update(connection.exec_driver_sql(sql, params).all())
        get = found.get
        return np.fromiter((get(u, 0) for u in stored), dtype=np.float64, count=len(stored))

    def null_of(self, key_id: str, limit: int = NULL_WINDOW) -> np.ndarray:
        """The spoof z of the key's most recent ``limit`` outputs past WARMUP (the check's null)."""
        with self.store.read() as session:
            values = session.scalars(select(KeyOutputRow.z).where(
                KeyOutputRow.key_id == key_id, KeyOutputRow.z.is_not(None), KeyOutputRow.outputs_before >= WARMUP)
                .order_by(KeyOutputRow.id.desc()).limit(limit)).all()
        return np.asarray(values, dtype=np.float64)

    def outputs(self, key_id: str) -> int:
        """How many of the key's outputs were remembered."""
        with self.store.read() as session:
            return self._outputs(session, key_id)

    @staticmethod
    def _outputs(session, key_id: str) -> int:
        last = session.scalar(select(KeyOutputRow.outputs_before).where(KeyOutputRow.key_id == key_id)
                              .order_by(KeyOutputRow.id.desc()).limit(1))
        return 0 if last is None else int(last) + 1

    def record(self, key_id: str, units: np.ndarray, z: float | None, grams: np.ndarray | None = None) -> None:
        """One watermarked output of ``key_id``: each distinct unit's count + 1, and the output's row with
        its spoof z (against the counts before it; None when it had too few counted units) and its sampled
        n-grams (``db.output_grams.output_grams``; None or empty: none kept). One transaction. Two workers
        recording at once may give two rows the same ``outputs_before``: it only places the WARMUP line one
        output later."""
        distinct = sorted(set(as_stored(np.unique(units))))
        with self.store.write() as session:
            insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
            for start in range(0, len(distinct), CHUNK):
                statement = insert(OutputUnitRow).values(
                    [{"key_id": key_id, "unit": unit, "outputs": 1} for unit in distinct[start:start + CHUNK]])
                session.execute(statement.on_conflict_do_update(
                    index_elements=[OutputUnitRow.key_id, OutputUnitRow.unit],
                    set_={"outputs": OutputUnitRow.outputs + 1}))
            finite = z is not None and math.isfinite(z)
            session.add(KeyOutputRow(key_id=key_id, outputs_before=self._outputs(session, key_id),
                                     z=float(z) if finite else None, created_at=utc_now(), units=packed(distinct),
                                     grams=packed(np.unique(grams).tolist()) if grams is not None and len(grams) else None))

    def aggregate(self, key_id: str) -> tuple[np.ndarray, np.ndarray, int]:
        """(Every unit the key emitted [int64], in how many outputs [int64], the newest row id they
        include): read between two looks at the newest id, retried while outputs land in between."""
        table = OutputUnitRow.__tablename__
        for _ in range(4):
            with self.store.read() as session:
                newest = self._newest_id(session, key_id)
                connection = session.connection()
                mark = _PLACEHOLDERS.get(connection.dialect.paramstyle, "?")
                rows = connection.exec_driver_sql(f"SELECT unit, outputs FROM {table} WHERE key_id = {mark}",
                                                  (key_id,)).all()
                if self._newest_id(session, key_id) == newest:
                    break
        units = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        counts = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        return units, counts, newest

    @staticmethod
    def _newest_id(session, key_id: str) -> int:
        return int(session.scalar(select(func.coalesce(func.max(KeyOutputRow.id), 0))
                                  .where(KeyOutputRow.key_id == key_id)))

    def rows_since(self, key_id: str, after: int, skip: set[int]) -> list[tuple]:
        """The key's output rows with id > ``after`` not in ``skip``, oldest first: (id, outputs_before, z,
        units bytes or None, n-gram bytes or None). Ids first, then only the rows wanted, so looking back costs
        no unit bytes."""
        with self.store.read() as session:
            ids = [i for i in session.scalars(select(KeyOutputRow.id).where(
                KeyOutputRow.key_id == key_id, KeyOutputRow.id > after).order_by(KeyOutputRow.id)).all()
                if i not in skip]
            rows = []
            for start in range(0, len(ids), CHUNK):
                rows += session.execute(select(KeyOutputRow.id, KeyOutputRow.outputs_before, KeyOutputRow.z,
                                               KeyOutputRow.units, KeyOutputRow.grams)
                                        .where(KeyOutputRow.id.in_(ids[start:start + CHUNK]))).all()
        return sorted((tuple(r) for r in rows), key=lambda r: r[0])

    def grams_through(self, key_id: str, newest: int, limit: int | None = None) -> list[tuple[int, bytes]]:
        """(row id, n-gram bytes) of the key's outputs up to row ``newest`` that kept n-grams, oldest first: the
        newest ``limit`` of them (None: all)."""
        with self.store.read() as session:
            found = session.execute(
                select(KeyOutputRow.id, KeyOutputRow.grams).where(
                    KeyOutputRow.key_id == key_id, KeyOutputRow.id <= newest, KeyOutputRow.grams.is_not(None))
                .order_by(KeyOutputRow.id.desc()).limit(limit)).all()
        return [(int(i), g) for i, g in reversed(found)]

    def units_of(self, row_id: int) -> np.ndarray | None:
        """One remembered output's distinct unit identities (int64; None for a row without them)."""
        with self.store.read() as session:
            units = session.scalar(select(KeyOutputRow.units).where(KeyOutputRow.id == row_id))
        return None if units is None else np.frombuffer(units, dtype="<i8").astype(np.int64)


@dataclass(frozen=True, slots=True)
class NullSample:
    """The spoof z of a key's most recent outputs past the warm-up: sorted, with their mean and sd."""

    z: np.ndarray
    mean: float
    sd: float

    @classmethod
    def of(cls, values) -> NullSample:
        z = np.sort(np.asarray(values, dtype=np.float64))
        z = z[np.isfinite(z)]
        return cls(z, float(z.mean()) if z.size else math.nan, float(z.std(ddof=1)) if z.size > 1 else math.nan)


class KeyCopy:
    """One key's memory as a detector worker holds it: the unit counts (``db.count_table.CountTable``), the
    null window, and which output each remembered n-gram belongs to (``db.output_grams.GramIndex``)."""

    def __init__(self, units: np.ndarray, counts: np.ndarray, newest: int, null: list[tuple[int, float]],
                 grams: list[tuple[int, bytes]] = (), grams_kept: int | None = GRAMS_KEPT) -> None:
        self.table = CountTable(units, counts)
        self.grams = GramIndex(grams_kept)
        for row_id, packed_grams in grams:
            self.grams.add(row_id, np.frombuffer(packed_grams, dtype="<i8"))
        self.kept_units: dict[int, bytes | None] = {}  # row id -> its units (UNITS_KEPT, oldest dropped first)
        self.newest = newest
        self.seen: set[int] = set()  # row ids within LOOK_BACK of ``newest`` already counted
        self._null_rows = sorted(null)[-NULL_WINDOW:]  # (row id, z), oldest first
        self.null = NullSample.of([z for _, z in self._null_rows])
        self.synced_at = time.monotonic()

    def counts(self, identities: np.ndarray) -> np.ndarray:
        """In how many of the key's outputs each unit (uint64 identities) occurred, as float64."""
        return self.table.counts(identities)

    def add(self, rows: list[tuple]) -> None:
        """Count ``rows`` (id, outputs_before, z, units bytes, n-gram bytes or None) in: their units, their z in
        the null window, their n-grams."""
        if not rows:
            return
        self.table.add(np.concatenate([np.frombuffer(row[3], dtype="<i8") for row in rows]).astype(np.int64))
        for row_id, _, _, units, packed_grams in rows:
            if packed_grams is not None:
                self.grams.add(row_id, np.frombuffer(packed_grams, dtype="<i8"))
            self.keep_units(row_id, units)
        for row_id, outputs_before, z, *_ in rows:
            self.seen.add(row_id)
            self.newest = max(self.newest, row_id)
            if z is not None and math.isfinite(z) and outputs_before >= WARMUP:
                self._null_rows.append((row_id, float(z)))
        self.seen = {i for i in self.seen if i > self.newest - LOOK_BACK}
        if any(row[2] is not None for row in rows):
            self._null_rows = sorted(self._null_rows)[-NULL_WINDOW:]
            self.null = NullSample.of([z for _, z in self._null_rows])

    def keep_units(self, row_id: int, units: bytes | None) -> None:
        """Keep one output's units at hand (``MemoryMirror.units_of``), the oldest kept dropped past UNITS_KEPT."""
        self.kept_units[row_id] = units
        while len(self.kept_units) > UNITS_KEPT:
            del self.kept_units[next(iter(self.kept_units))]


class MemoryMirror:
    """Each key's memory in this process (``view``), for the detector's spoof check: the counts a verdict looks
    up and the null it is compared with, as the store had them at most ``sync_seconds`` ago."""

    def __init__(self, memory: OutputMemory, sync_seconds: float = SYNC_SECONDS,
                 grams_kept: int | None = GRAMS_KEPT) -> None:
        """``grams_kept``: the newest outputs per key whose wording ``matches_own_output`` recognises (None: all)."""
        self.memory = memory
        self.sync_seconds = sync_seconds
        self.grams_kept = grams_kept
        self._keys: dict[str, KeyCopy] = {}
        self._lock = threading.Lock()

    def view(self, key_id: str) -> KeyCopy:
        with self._lock:
            copy = self._keys.get(key_id)
            if copy is None:
                copy = self._keys[key_id] = self._load(key_id)
            elif time.monotonic() - copy.synced_at >= self.sync_seconds:
                rows = self.memory.rows_since(key_id, copy.newest - LOOK_BACK, copy.seen)
                if any(row[3] is None for row in rows):  # written by a service that does not keep them
                    copy = self._keys[key_id] = self._load(key_id)
                else:
                    copy.add(rows)
                    copy.synced_at = time.monotonic()
            return copy

    def units_of(self, key_id: str, row_id: int) -> np.ndarray | None:
        """The distinct unit identities of one of the key's outputs (int64; None for a row without them):
        from the worker's copy when it has them at hand, else one query (then kept)."""
        copy = self.view(key_id)
        if row_id in copy.kept_units:
            units = copy.kept_units[row_id]
            return None if units is None else np.frombuffer(units, dtype="<i8").astype(np.int64)
        found = self.memory.units_of(row_id)
        with self._lock:
            copy.keep_units(row_id, None if found is None else found.astype("<i8").tobytes())
        return found

    def _load(self, key_id: str) -> KeyCopy:
        units, counts, newest = self.memory.aggregate(key_id)
        with self.memory.store.read() as session:
            null = session.execute(select(KeyOutputRow.id, KeyOutputRow.z).where(
                KeyOutputRow.key_id == key_id, KeyOutputRow.z.is_not(None), KeyOutputRow.outputs_before >= WARMUP,
                KeyOutputRow.id <= newest).order_by(KeyOutputRow.id.desc()).limit(NULL_WINDOW)).all()
            recent = session.scalars(select(KeyOutputRow.id).where(
                KeyOutputRow.key_id == key_id, KeyOutputRow.id > newest - LOOK_BACK,
                KeyOutputRow.id <= newest)).all()
        copy = KeyCopy(units, counts, newest, [(int(i), float(z)) for i, z in null],
                       self.memory.grams_through(key_id, newest, self.grams_kept), self.grams_kept)
        copy.seen = set(recent)
        return copy
