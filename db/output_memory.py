"""What the generation service wrote under each key, as the spoof check needs it (issue #17).

Per key: in how many watermarked outputs each unit occurred (``output_units``; key-free unit identities,
never text), and one row per output with the spoof z of that output against the counts before it
(``key_outputs``: the check's null, from the WARMUP-th output on: against a nearly empty memory every
unit looks unlearnable and the z of early outputs is not what later ones get). The generation service records an output when it issues its receipt; the detector service reads
both for a verdict that says ``watermarked`` (``detector.spoof_check``). Shared by every worker of both
services through the store, on SQLite and PostgreSQL alike (atomic upserts).
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from db.rows import KeyOutputRow, OutputUnitRow, utc_now
from db.store import Store

# the null is the key's most recent outputs: genuine z drifts up as the counts grow (1.6 -> 2.1 over 2,000 real
# outputs), and a window of 1,000 keeps the normal fit's flag rates at 1e-3, 1e-2 and 5e-2 nominal where 5,000
# lagged (5 % -> 6.0 %; docs/security.md, evaluation/own_output_null.py)
NULL_WINDOW = 1_000
WARMUP = 40  # outputs remembered before a key's outputs enter its null
NULL_SECONDS = 60.0  # how stale a process's copy of a key's null may be
CHUNK = 500  # units per IN (...) / upsert statement (SQLite's variable limit, PostgreSQL's plan size)


def as_stored(units: np.ndarray) -> list[int]:
    """uint64 unit identities as the int64 the column holds (the same 64 bits)."""
    return np.ascontiguousarray(units, dtype=np.uint64).view(np.int64).tolist()


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
        self._nulls: dict[str, tuple[float, np.ndarray]] = {}  # key id -> (read at, null): see cached_null_of
        self._lock = threading.Lock()

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

    def cached_null_of(self, key_id: str) -> np.ndarray:
        """``null_of``, re-read at most every NULL_SECONDS per process: it moves by one output at a time."""
        now = time.monotonic()
        with self._lock:
            read_at, null = self._nulls.get(key_id, (None, None))
        if read_at is None or now - read_at > NULL_SECONDS:
            null = self.null_of(key_id)
            with self._lock:
                self._nulls[key_id] = (now, null)
        return null

    def forget_cached_nulls(self) -> None:
        """The next ``cached_null_of`` reads the store (a replay that needs each null as of its output)."""
        with self._lock:
            self._nulls.clear()

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

    def record(self, key_id: str, units: np.ndarray, z: float | None) -> None:
        """One watermarked output of ``key_id``: each distinct unit's count + 1, and the output's row with
        its spoof z (against the counts before it; None when it had too few counted units). One
        transaction. Two workers recording at once may give two rows the same ``outputs_before``: it only
        places the WARMUP line one output later."""
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
                                     z=float(z) if finite else None, created_at=utc_now()))
