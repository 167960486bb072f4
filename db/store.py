"""The database both services share: the engine/session factory (``Store``), key metadata, and the verdict
methods (which run db/verdicts.py). The tables are in db/rows.py.

Where: ``PROVMARK_DATABASE_URL`` (PostgreSQL through psycopg 3, ``postgresql+psycopg://user@host/db``)
or, by default, SQLite at ``$PROVMARK_HOME/provmark.db`` (created 0600) in WAL mode with a busy timeout.
Verdict ids are UUID4 strings; ``text_sha256`` is SHA-256 of the text's UTF-8 bytes (``text_sha256()``).
The schema is owned by the Alembic migrations in ``db/migrations`` (``Store.upgrade()``).

Writes go through ``Store.write()``: one transaction that commits or rolls back as a whole. On SQLite
it starts with ``BEGIN IMMEDIATE`` (the write lock is taken up front, so two writers never deadlock on
a lock upgrade); the audit chain serialises appends with the chain-head row (see ``db.audit``).
An unreachable database raises ``StoreUnavailable`` (services answer 503).

Texts are stored only when retention is on (``PROVMARK_RETAIN_TEXT=1`` or ``retain_text=True``);
otherwise a verdict keeps the text's SHA-256 and the scores.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, event, exc, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from db import verdicts
from db.audit import append_event
from db.caller import Caller
from db.rows import KeyRecordRow, text_sha256, utc_now
from db.verdicts import DEFAULT_PAGE_SIZE, VerdictPage, VerdictRecord
from watermark.key_info import KeyInfo
from watermark.paths import PRIVATE_MODE, provmark_home

DATABASE_URL_ENV = "PROVMARK_DATABASE_URL"
RETAIN_TEXT_ENV = "PROVMARK_RETAIN_TEXT"
SQLITE_FILE = "provmark.db"
SQLITE_BUSY_TIMEOUT_S = 30.0  # writers queue behind BEGIN IMMEDIATE; 30 s outlasts any single transaction
PG_CONNECT_TIMEOUT_S = 5  # an unreachable server fails fast (-> 503) instead of hanging a request
_BEGIN_OPTION = "provmark_sqlite_begin"


class StoreError(Exception):
    """Any store failure. Messages carry no secrets and no database passwords."""


class StoreUnavailable(StoreError):
    """The database cannot be reached (or stays locked): retry later; services answer 503."""


def database_url(home: Path | None = None) -> str:
    """``PROVMARK_DATABASE_URL`` if set, else the SQLite file in the state folder."""
    configured = os.environ.get(DATABASE_URL_ENV)
    if configured:
        return configured
    folder = Path(home).expanduser() if home is not None else provmark_home()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return f"sqlite:///{folder / SQLITE_FILE}"


def _retain_text_default() -> bool:
    return os.environ.get(RETAIN_TEXT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


class Store:
    """The engine and session factory for one database; cheap to share across threads."""

    def __init__(self, url: str | None = None, home: Path | None = None, retain_text: bool | None = None):
        self.url = make_url(url or database_url(home))
        self.retain_text = _retain_text_default() if retain_text is None else bool(retain_text)
        self.engine = _make_engine(self.url)
        # Same pool; on SQLite its transactions take the write lock at BEGIN.
        self.write_engine = self.engine.execution_options(**{_BEGIN_OPTION: "BEGIN IMMEDIATE"})
        self._read_sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(self.write_engine, expire_on_commit=False)

    def __repr__(self) -> str:
        return f"Store({self.safe_url!r})"

    @property
    def safe_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def upgrade(self) -> str:
        """Apply pending migrations (idempotent, safe with several workers); returns the head revision."""
        from db.migrations import upgrade_to_head  # noqa: PLC0415 (alembic loads only where the schema migrates)

        with self.unavailable_as_error():
            return upgrade_to_head(self.write_engine)

    def close(self) -> None:
        self.engine.dispose()

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: commits when the block ends, rolls everything back on any error."""
        with self.unavailable_as_error(), self._write_sessions() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (its transaction is rolled back at the end)."""
        with self.unavailable_as_error(), self._read_sessions() as session:
            yield session

    @contextlib.contextmanager
    def unavailable_as_error(self) -> Iterator[None]:
        """Turn "cannot connect / database locked" driver errors into ``StoreUnavailable``."""
        try:
            yield
        except (exc.OperationalError, exc.InterfaceError) as error:
            reason = type(error.orig).__name__ if error.orig is not None else type(error).__name__
            raise StoreUnavailable(f"database {self.safe_url} is unavailable ({reason})") from error

    # --- watermark key metadata ------------------------------------------------------------------

    def record_key_event(self, info: KeyInfo, action: str, actor: str, details: dict | None = None) -> None:
        """Upsert a key's public metadata and append a ``key.<action>`` audit event, in one transaction
        (``details``: public facts the event carries too, e.g. a calibration's summary)."""
        with self.write() as session:
            row = session.get(KeyRecordRow, info.key_id, with_for_update=True)
            if row is None:
                row = KeyRecordRow(key_id=info.key_id)
                session.add(row)
            row.status, row.fingerprint = info.status, info.fingerprint
            row.created_at, row.retired_at, row.updated_at = info.created_at, info.retired_at, utc_now()
            session.flush()
            append_event(session, f"key.{action}", actor, info.key_id,
                         {"status": info.status, "fingerprint": info.fingerprint, **(details or {})})

    def list_key_records(self) -> list[dict]:
        """Public metadata of every key the store has heard of, by key id."""
        with self.read() as session:
            rows = session.scalars(select(KeyRecordRow).order_by(KeyRecordRow.key_id))
            return [{"key_id": r.key_id, "status": r.status, "fingerprint": r.fingerprint,
                     "created_at": r.created_at, "retired_at": r.retired_at} for r in rows]

    # --- verdicts (db/verdicts.py) ------------------------------------------------------------

    def record_verdict(self, record: VerdictRecord, caller: Caller, text: str | None = None) -> str:
        """Store a verdict and its ``detection`` audit event in one transaction; returns the verdict id.

        ``text`` is kept only when retention is on, and must hash to ``record.text_sha256``.
        """
        if text is not None and isinstance(record, VerdictRecord) and text_sha256(text) != record.text_sha256:
            raise ValueError("text does not match text_sha256")
        return verdicts.record_verdicts(self, [record], caller, [text])[0]

    def get_verdict(self, verdict_id: str, exact: bool = True) -> dict | None:
        """One verdict, whole (``exact``) or in the audit scope's detect-scope view (``db.verdicts``)."""
        return verdicts.get_verdict(self, verdict_id, exact=exact)

    def list_verdicts(self, filters: verdicts.VerdictFilter = verdicts.VerdictFilter(), *, cursor: str | None = None,
                      limit: int = DEFAULT_PAGE_SIZE, exact: bool = True) -> VerdictPage:
        """Verdicts newest first, filtered (``since`` inclusive, ``until`` exclusive); pass
        ``next_cursor`` back to get the next page. Pages are stable while new verdicts arrive. ``exact=False``:
        the audit scope's detect-scope view, filtered on it (``db.verdicts``)."""
        return verdicts.list_verdicts(self, filters, cursor=cursor, limit=limit, exact=exact)

    def verdicts_csv(self, filters: verdicts.VerdictFilter = verdicts.VerdictFilter(), *,
                     limit: int = verdicts.MAX_PAGE_SIZE, exact: bool = True) -> Iterator[str]:
        """CSV lines (header first) of every verdict ``filters`` keeps, page by page."""
        return verdicts.verdicts_csv(self, filters, limit=limit, exact=exact)



def _make_engine(url) -> Engine:
    if url.get_backend_name() == "sqlite":
        _create_private_file(url.database)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
        _configure_sqlite(engine)
        return engine
    if url.get_backend_name() == "postgresql":
        return create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
    raise StoreError(f"unsupported database {url.get_backend_name()!r}: use sqlite or postgresql+psycopg")


def _create_private_file(database: str | None) -> None:
    """Create a new SQLite file as 0600 (SQLite gives its -wal/-shm files the same mode)."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if path.parent.is_dir() and not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE))


def _configure_sqlite(engine: Engine) -> None:
    """WAL, busy timeout, foreign keys; and our own BEGIN so write transactions can be IMMEDIATE."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # pysqlite's implicit BEGIN off: we emit our own
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection):
        connection.exec_driver_sql(connection.get_execution_options().get(_BEGIN_OPTION, "BEGIN"))
