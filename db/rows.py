"""The database's tables as SQLAlchemy 2.0 typed models, and the helpers every row uses (UTC times, ids,
the text hash). The schema itself is owned by the Alembic migrations in ``db/migrations``."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, Index, Integer, LargeBinary, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


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
    # the detect-scope view (detector.disclosure) that the ``audit`` scope reads and filters on: copies of
    # ``options["disclosed"]`` (covered by the row's digest through ``options``); None when never recorded
    shown_verdict: Mapped[str | None] = mapped_column(String(32), index=True, nullable=True)
    shown_z: Mapped[float | None] = mapped_column(Float, nullable=True)

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


VERDICTS = ("watermarked", "not_watermarked", "insufficient_text")  # what a stored verdict can say


def shown_of(verdict: str, options: dict | None) -> tuple[str | None, float | None]:
    """(shown verdict, shown z) of a row: its recorded detect-scope view; an insufficient text is one in every
    view (and shows no score); (None, None) when no view was recorded. The ``shown_*`` columns hold exactly
    this, and ``audit verify`` checks that they still do (``db.audit_rows``)."""
    disclosed = (options or {}).get("disclosed")
    if isinstance(disclosed, dict) and disclosed.get("verdict") in VERDICTS:
        z = disclosed.get("z_score")
        return disclosed["verdict"], None if z is None else float(z)
    if verdict == "insufficient_text":
        return verdict, None
    return None, None


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
    jws: Mapped[str | None] = mapped_column(Text, nullable=True)  # the compact JWS (receipts since revision 0008)


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
    # hex SHA-256(0x00 || log entry): the event as a leaf of the transparency log (db.audit.log_entry)
    leaf_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)


class AuditHeadRow(Base):
    """The chain's last sequence number and hash: the row appenders lock, and the tail's witness."""

    __tablename__ = "audit_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    seq: Mapped[int] = mapped_column(Integer)
    hash: Mapped[str] = mapped_column(String(64))


class TreeHeadRow(Base):
    """A signed head of the transparency log, kept for good (``db.transparency``, ``provenance.tree_head``)."""

    __tablename__ = "tree_heads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tree_size: Mapped[int] = mapped_column(BigInteger, index=True)
    timestamp: Mapped[int] = mapped_column(BigInteger)  # milliseconds since the epoch, as signed
    root_hash: Mapped[str] = mapped_column(String(64))  # hex
    signature: Mapped[str] = mapped_column(String(100))  # base64 Ed25519 over TreeHeadDataV2
    key_id: Mapped[str] = mapped_column(String(64))
    log_id: Mapped[str] = mapped_column(String(64))
    checkpoint: Mapped[str] = mapped_column(Text)  # the signed note, whole
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class SigningKeyRow(Base):
    """One key of the deployment's provenance identity (``provenance.identity``, ``db.identity``)."""

    __tablename__ = "signing_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(20), index=True)
    kid: Mapped[str] = mapped_column(String(64))
    public_key: Mapped[str] = mapped_column(String(64))  # base64 raw Ed25519
    created_at: Mapped[str] = mapped_column(String(32))  # ISO UTC, as MACed
    retired_at: Mapped[str | None] = mapped_column(String(32), nullable=True)
    certificate: Mapped[str | None] = mapped_column(Text, nullable=True)  # PEM (the C2PA roles)
    sealed: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON; NULL once retired
    mac: Mapped[str] = mapped_column(String(64))


class IdentityRow(Base):
    """The one row that says a deployment's identity exists: concurrent creators collide on its key."""

    __tablename__ = "deployment_identity"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    deployment_id: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


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


class OutputUnitRow(Base):
    """In how many of a key's watermarked outputs a unit occurred (``db.output_memory``; the spoof check's
    learnability). Key-free unit identities (``watermark.units``, a uint64 stored as its int64 bits), no text."""

    __tablename__ = "output_units"

    key_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    unit: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    outputs: Mapped[int] = mapped_column(Integer)


class KeyOutputRow(Base):
    """One watermarked output the generation service remembered for a key (``db.output_memory``): how many
    of the key's outputs were remembered before it, and its spoof z against their counts (None when it had
    too few counted units): the null ``detector.spoof_check`` compares a verdict's spoof z with."""

    __tablename__ = "key_outputs"
    __table_args__ = (Index("ix_key_outputs_key_id_id", "key_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    outputs_before: Mapped[int] = mapped_column(Integer)
    z: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utc_now)
    # the output's distinct unit identities, sorted, as little-endian uint64 bytes (key-free, no text): what a
    # detector worker's copy of the counts adds when it reads this row (db.output_memory.MemoryMirror); None
    # for rows written before 0004
    units: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # the output's sampled keyed 5-gram hashes, sorted, as little-endian int64 bytes (detector.output_match: does
    # a text repeat this output's wording?); None for rows written before 0005 and outputs too short to have any
    grams: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


LAST_VECTOR_FORM = 3  # output_vectors.form of rows written since: they hold no vector


class OutputVectorRow(Base):
    """One remembered output's words (``db.semantic_memory``): their keyed stem hashes and counts
    (``db.passage_signature``), and the receipt it was issued with. No text: ``paraphrase_of_own_output`` names the
    receipt of the output a paraphrase restates. Rows from before revision 0014 also hold a passage vector, which
    nothing reads any more."""

    __tablename__ = "output_vectors"
    # ids never reused (SQLite AUTOINCREMENT): a worker's copy tells a purge from new rows by them
    __table_args__ = (Index("ix_output_vectors_key_id_id", "key_id", "id"), {"sqlite_autoincrement": True})

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_id: Mapped[str] = mapped_column(String(32))
    receipt_id: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utc_now)
    # rows from before revision 0014: a passage vector (512 int8), which nothing reads; new rows none
    vector: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # the recipe of a row's passage vector when it had one (1 before revision 0012, then 2 and 3); new rows the last
    form: Mapped[int] = mapped_column(Integer, default=LAST_VECTOR_FORM, server_default="1")
    # the output's keyed stem hashes and counts (db.passage_signature); NULL for rows from before revision 0013,
    # which the semantic match never reads
    signature: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)


class ManifestRow(Base):
    """The C2PA manifest store of one generated text (``db.manifests``): what ``GET /v1/manifests/<id>``
    and the soft-binding resolution API return, found by manifest id, receipt, text hash or soft binding."""

    __tablename__ = "c2pa_manifests"

    manifest_id: Mapped[str] = mapped_column(String(100), primary_key=True)  # the active manifest's label
    receipt_id: Mapped[str] = mapped_column(String(36), index=True)
    text_sha256: Mapped[str] = mapped_column(String(64), index=True)  # of the visible text, wrapper removed
    embedded: Mapped[bool] = mapped_column(Boolean)  # delivered inside the text (C2PA 2.4 Annex A.8)
    soft_binding: Mapped[str | None] = mapped_column(String(200), index=True, nullable=True)  # "alg value"
    store_sha256: Mapped[str] = mapped_column(String(64))
    manifest_store: Mapped[bytes] = mapped_column(LargeBinary)  # application/c2pa (JUMBF)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
