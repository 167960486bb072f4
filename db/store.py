"""The detector's database: typed models, the engine/session factory and the verdict queries.

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

import base64
import contextlib
import csv
import hashlib
import io
import json
import math
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    Text,
    create_engine,
    event,
    exc,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker
from sqlalchemy.types import TypeDecorator

from watermark.keys import PRIVATE_MODE, KeyInfo
from watermark.paths import provmark_home

DATABASE_URL_ENV = "PROVMARK_DATABASE_URL"
RETAIN_TEXT_ENV = "PROVMARK_RETAIN_TEXT"
SQLITE_FILE = "provmark.db"
SQLITE_BUSY_TIMEOUT_S = 30.0  # writers queue behind BEGIN IMMEDIATE; 30 s outlasts any single transaction
PG_CONNECT_TIMEOUT_S = 5  # an unreachable server fails fast (-> 503) instead of hanging a request
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
VERDICTS = ("watermarked", "not_watermarked", "insufficient_text")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_BEGIN_OPTION = "provmark_sqlite_begin"


class StoreError(Exception):
    """Any store failure. Messages carry no secrets and no database passwords."""


class StoreUnavailable(StoreError):
    """The database cannot be reached (or stays locked): retry later; services answer 503."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso_utc(moment: datetime) -> str:
    """Fixed-width ISO 8601 UTC with microseconds, e.g. 2025-01-31T12:00:00.000000Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def text_sha256(text: str) -> str:
    """SHA-256 of the text's UTF-8 bytes: the one hash verdicts and receipts are matched by."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_id() -> str:
    return str(uuid.uuid4())


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes in, aware UTC datetimes out, on SQLite (naive storage) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given: store times as aware UTC datetimes")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONDocument = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    pass


class VerdictRow(Base):
    """One detection: the text's hash and scores, never the text unless retention is on."""

    __tablename__ = "verdicts"
    __table_args__ = (Index("ix_verdicts_created_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    text_sha256: Mapped[str] = mapped_column(String(64), index=True)
    verdict: Mapped[str] = mapped_column(String(32), index=True)
    z: Mapped[float] = mapped_column(Float)
    p_value: Mapped[float] = mapped_column(Float)
    green_count: Mapped[int] = mapped_column(Integer)
    scored_count: Mapped[int] = mapped_column(Integer)
    green_fraction: Mapped[float] = mapped_column(Float)
    spec: Mapped[str] = mapped_column(String(200))
    spec_fingerprint: Mapped[str] = mapped_column(String(64))
    tokenizer_fingerprint: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str | None] = mapped_column(String(32), index=True)
    options: Mapped[dict] = mapped_column(JSONDocument)
    windows: Mapped[dict | None] = mapped_column(JSONDocument)
    receipt_id: Mapped[str | None] = mapped_column(String(36))
    caller_token_id: Mapped[str | None] = mapped_column(String(36))
    caller_name: Mapped[str | None] = mapped_column(String(100))
    text: Mapped[str | None] = mapped_column(Text)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "created_at": iso_utc(self.created_at),
            "text_sha256": self.text_sha256,
            "verdict": self.verdict,
            "z": self.z,
            "p_value": self.p_value,
            "green_count": self.green_count,
            "scored_count": self.scored_count,
            "green_fraction": self.green_fraction,
            "spec": self.spec,
            "spec_fingerprint": self.spec_fingerprint,
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "key_id": self.key_id,
            "options": self.options,
            "windows": self.windows,
            "receipt_id": self.receipt_id,
            "caller_token_id": self.caller_token_id,
            "caller_name": self.caller_name,
            "text": self.text,
        }


class ReceiptRow(Base):
    """A signed generation receipt (see ``db.receipts``)."""

    __tablename__ = "receipts"

    receipt_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[str] = mapped_column(String(32))  # the exact signed ISO string
    text_sha256: Mapped[str] = mapped_column(String(64), index=True)
    token_count: Mapped[int] = mapped_column(Integer)
    model_id: Mapped[str] = mapped_column(String(200))
    spec_fingerprint: Mapped[str] = mapped_column(String(64))
    key_id: Mapped[str] = mapped_column(String(32))
    signer_id: Mapped[str] = mapped_column(String(32))
    signature: Mapped[str] = mapped_column(String(100))
    stored_at: Mapped[datetime] = mapped_column(UTCDateTime())


class AuditEventRow(Base):
    """One hash-chained audit event (see ``db.audit``)."""

    __tablename__ = "audit_events"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    event_id: Mapped[str] = mapped_column(String(36), unique=True)
    kind: Mapped[str] = mapped_column(String(40), index=True)
    actor: Mapped[str] = mapped_column(String(120))
    subject_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    details: Mapped[str] = mapped_column(Text)  # canonical JSON, exactly the hashed bytes
    prev_hash: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(64), unique=True)


class AuditHeadRow(Base):
    """The chain's last sequence number and hash: the row appenders lock, and the tail's witness."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))


class ApiTokenRow(Base):
    """An API token: its SHA-256 only (see ``db.api_tokens``)."""

    __tablename__ = "api_tokens"

    token_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(200))  # space-separated, sorted
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class KeyRecordRow(Base):
    """Public metadata of a watermark key (id, status, fingerprint, times); never its secret."""

    __tablename__ = "watermark_keys"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    fingerprint: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[str] = mapped_column(String(32))
    retired_at: Mapped[str | None] = mapped_column(String(32))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class DetectionUsageRow(Base):
    """Tokens an API token had scored on one UTC day (``db.budget``): one row per token and day,
    shared by every worker and both services."""

    __tablename__ = "detection_usage"

    token_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD, UTC
    tokens: Mapped[int] = mapped_column(Integer)
    exhausted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


@dataclass(slots=True, frozen=True)
class Caller:
    """Who asked: an API token (id and name) or a local actor such as ``cli``."""

    name: str
    token_id: str | None = None

    @property
    def actor(self) -> str:
        return f"token:{self.token_id}" if self.token_id else self.name


@dataclass(slots=True)
class VerdictRecord:
    """What the detector hands the store for one verdict; validated here, at the door."""

    text_sha256: str
    verdict: str
    z: float
    p_value: float
    green_count: int
    scored_count: int
    green_fraction: float
    spec: str
    spec_fingerprint: str
    tokenizer_fingerprint: str
    key_id: str | None
    options: dict = field(default_factory=dict)
    windows: dict | None = None
    receipt_id: str | None = None

    def __post_init__(self):
        if not isinstance(self.text_sha256, str) or not _SHA256_RE.fullmatch(self.text_sha256):
            raise ValueError("text_sha256 must be 64 lowercase hex digits")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
        for name in ("green_count", "scored_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        if self.green_count > self.scored_count:
            raise ValueError("green_count must not exceed scored_count")
        for name in ("z", "p_value", "green_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                raise ValueError(f"{name} must be a number")
            setattr(self, name, float(value))
        if not 0.0 <= self.p_value <= 1.0 or not 0.0 <= self.green_fraction <= 1.0:
            raise ValueError("p_value and green_fraction must lie in [0, 1]")
        for name in ("spec", "spec_fingerprint", "tokenizer_fingerprint"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if not isinstance(self.options, dict) or not (self.windows is None or isinstance(self.windows, dict)):
            raise ValueError("options must be a dict and windows a dict or None")


@dataclass(slots=True, frozen=True)
class VerdictPage:
    items: list[dict]
    next_cursor: str | None  # None: this was the last page


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
        from db.migrations import upgrade_to_head  # alembic is only needed here

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
        from db.audit import append_event  # audit imports this module

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

    # --- verdicts ----------------------------------------------------------------------------

    def record_verdict(self, record: VerdictRecord, caller: Caller, text: str | None = None) -> str:
        """Store a verdict and its ``detection`` audit event in one transaction; returns the verdict id.

        ``text`` is kept only when retention is on, and must hash to ``record.text_sha256``.
        """
        from db.audit import append_event  # audit imports this module

        if not isinstance(record, VerdictRecord) or not isinstance(caller, Caller):
            raise TypeError("record_verdict takes a VerdictRecord and a Caller")
        if text is not None and text_sha256(text) != record.text_sha256:
            raise ValueError("text does not match text_sha256")
        verdict_id = new_id()
        row = VerdictRow(
            id=verdict_id,
            created_at=utc_now(),
            text=text if self.retain_text else None,
            caller_token_id=caller.token_id,
            caller_name=caller.name,
            **{name: getattr(record, name) for name in VerdictRecord.__dataclass_fields__},
        )
        from db.audit_rows import row_digest

        details = {"verdict": record.verdict, "z": record.z, "key_id": record.key_id,
                   "spec_fingerprint": record.spec_fingerprint, "row_sha256": row_digest(row)}
        with self.write() as session:
            session.add(row)
            session.flush()  # the verdict row first: a constraint error leaves no audit event behind
            append_event(session, "detection", caller.actor, verdict_id, details)
        return verdict_id

    def get_verdict(self, verdict_id: str) -> dict | None:
        with self.read() as session:
            row = session.get(VerdictRow, verdict_id)
            return row.to_dict() if row is not None else None

    def list_verdicts(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        verdict: str | None = None,
        key_id: str | None = None,
        min_z: float | None = None,
        text_sha256: str | None = None,
        cursor: str | None = None,
        limit: int = DEFAULT_PAGE_SIZE,
    ) -> VerdictPage:
        """Verdicts newest first, filtered (``since`` inclusive, ``until`` exclusive); pass
        ``next_cursor`` back to get the next page. Pages are stable while new verdicts arrive."""
        if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            raise ValueError(f"limit must be an integer in [1, {MAX_PAGE_SIZE}]")
        if verdict is not None and verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
        query = select(VerdictRow)
        if since is not None:
            query = query.where(VerdictRow.created_at >= since)
        if until is not None:
            query = query.where(VerdictRow.created_at < until)
        if verdict is not None:
            query = query.where(VerdictRow.verdict == verdict)
        if key_id is not None:
            query = query.where(VerdictRow.key_id == key_id)
        if min_z is not None:
            query = query.where(VerdictRow.z >= float(min_z))
        if text_sha256 is not None:
            query = query.where(VerdictRow.text_sha256 == text_sha256)
        if cursor is not None:
            after_time, after_id = decode_cursor(cursor)
            query = query.where(
                or_(
                    VerdictRow.created_at < after_time,
                    (VerdictRow.created_at == after_time) & (VerdictRow.id < after_id),
                )
            )
        query = query.order_by(VerdictRow.created_at.desc(), VerdictRow.id.desc()).limit(limit + 1)
        with self.read() as session:
            rows = list(session.scalars(query))
        more = len(rows) > limit
        rows = rows[:limit]
        next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
        return VerdictPage([row.to_dict() for row in rows], next_cursor)

    def verdicts_csv(self, **filters: Any) -> Iterator[str]:
        """CSV lines (header first) of every verdict matching ``list_verdicts`` filters, page by page."""
        filters.pop("cursor", None)
        filters.setdefault("limit", MAX_PAGE_SIZE)
        yield _csv_line(CSV_COLUMNS)
        cursor = None
        while True:
            page = self.list_verdicts(cursor=cursor, **filters)
            for item in page.items:
                yield _csv_line([_csv_cell(item[name]) for name in CSV_COLUMNS])
            if page.next_cursor is None:
                return
            cursor = page.next_cursor


CSV_COLUMNS = (
    "id", "created_at", "verdict", "z", "p_value", "green_count", "scored_count", "green_fraction",
    "key_id", "spec", "spec_fingerprint", "tokenizer_fingerprint", "text_sha256", "receipt_id",
    "caller_token_id", "caller_name", "options", "windows",
)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    elif isinstance(value, (int, float)):
        return repr(value)
    value = str(value)
    # Spreadsheets run cells starting with these as formulas (OWASP "CSV injection").
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _csv_line(cells) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def encode_cursor(created_at: datetime, row_id: str) -> str:
    raw = json.dumps([iso_utc(created_at), row_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) position a cursor stands for; ValueError for anything malformed."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, row_id = json.loads(raw)
        if not isinstance(row_id, str):
            raise TypeError("cursor id is not a string")
        when = datetime.strptime(moment, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise ValueError("malformed cursor") from error
    return when, row_id


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
