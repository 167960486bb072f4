"""The audit events become the leaves of an RFC 9162 Merkle tree (``db.transparency``): each event keeps
its leaf hash, and every signed tree head is kept in ``tree_heads``.

Events already there get their leaf hashes here, computed as ``db.audit.log_entry`` does as of this
revision (a frozen copy below: a migration must not change later).

Revision ID: 0007_transparency_log
Revises: 0006_verdict_shown_view
Create Date: 2026-12-01
"""

import hashlib
import json
from datetime import UTC

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0007_transparency_log"
down_revision = "0006_verdict_shown_view"
branch_labels = None
depends_on = None

BATCH = 1000


def upgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("leaf_hash", sa.String(64), nullable=True))
    op.create_table(
        "tree_heads",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("tree_size", sa.BigInteger(), nullable=False, index=True),
        sa.Column("timestamp", sa.BigInteger(), nullable=False),
        sa.Column("root_hash", sa.String(64), nullable=False),
        sa.Column("signature", sa.String(100), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("log_id", sa.String(64), nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    events = sa.table("audit_events", sa.column("seq", sa.Integer), sa.column("event_id", sa.String),
                      sa.column("kind", sa.String), sa.column("actor", sa.String), sa.column("subject_id", sa.String),
                      sa.column("created_at", UTCDateTime()), sa.column("details", sa.Text),
                      sa.column("prev_hash", sa.String), sa.column("hash", sa.String),
                      sa.column("leaf_hash", sa.String))
    connection = op.get_bind()
    last = 0
    while True:  # in seq order, a batch at a time: a long log is never held in memory at once
        rows = connection.execute(sa.select(events).where(events.c.seq > last).order_by(events.c.seq)
                                  .limit(BATCH)).all()
        for row in rows:
            connection.execute(events.update().where(events.c.seq == row.seq).values(leaf_hash=_leaf_hash(row)))
        if len(rows) < BATCH:
            break
        last = rows[-1].seq


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _leaf_hash(row) -> str:
    """SHA-256(0x00 || entry) of the event as it reads now (an unreadable one keeps its stored chain hash)."""
    created_at = row.created_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    try:
        details = json.loads(row.details)
        chain_hash = hashlib.sha256(_canonical({
            "prev_hash": row.prev_hash, "event_id": row.event_id, "kind": row.kind, "actor": row.actor,
            "subject_id": row.subject_id, "created_at": created_at, "details": details})).hexdigest()
    except (TypeError, ValueError):
        details, chain_hash = {}, row.hash
    details = details if isinstance(details, dict) else {}
    subject_sha256 = details["subject_sha256"] if "subject_sha256" in details else details.get("row_sha256")
    entry = _canonical({"v": 1, "seq": row.seq, "event_id": row.event_id, "kind": row.kind,
                        "subject_id": row.subject_id, "subject_sha256": subject_sha256,
                        "created_at": created_at, "event_hash": chain_hash})
    return hashlib.sha256(b"\x00" + entry).hexdigest()


def downgrade() -> None:
    op.drop_table("tree_heads")
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("leaf_hash")
