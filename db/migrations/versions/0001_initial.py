"""Initial schema: verdicts, receipts, the audit chain and its head, API tokens, key metadata.

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from db.rows import UTCDateTime

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copy of db.audit.GENESIS_HASH = sha256(b"provmark/audit/genesis") (a test keeps them equal).
GENESIS_HASH = "7f1e8ddaca7fdd747b2fe6ad643a66a107d5aadec1cdfc9c550a31c8e55121cb"
JSON_DOCUMENT = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "verdicts",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=False, index=True),
        sa.Column("verdict", sa.String(32), nullable=False, index=True),
        sa.Column("z", sa.Float(), nullable=False),
        sa.Column("p_value", sa.Float(), nullable=False),
        sa.Column("green_count", sa.Integer(), nullable=False),
        sa.Column("scored_count", sa.Integer(), nullable=False),
        sa.Column("green_fraction", sa.Float(), nullable=False),
        sa.Column("spec", sa.String(200), nullable=False),
        sa.Column("spec_fingerprint", sa.String(64), nullable=False),
        sa.Column("tokenizer_fingerprint", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=True, index=True),
        sa.Column("options", JSON_DOCUMENT, nullable=False),
        sa.Column("windows", JSON_DOCUMENT, nullable=True),
        sa.Column("receipt_id", sa.String(36), nullable=True),
        sa.Column("caller_token_id", sa.String(36), nullable=True),
        sa.Column("caller_name", sa.String(100), nullable=True),
        sa.Column("text", sa.Text(), nullable=True),
    )
    op.create_index("ix_verdicts_created_id", "verdicts", ["created_at", "id"])
    op.create_table(
        "receipts",
        sa.Column("receipt_id", sa.String(36), primary_key=True),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=False, index=True),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.String(200), nullable=False),
        sa.Column("spec_fingerprint", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("signer_id", sa.String(32), nullable=False),
        sa.Column("signature", sa.String(100), nullable=False),
        sa.Column("stored_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "audit_events",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("event_id", sa.String(36), nullable=False, unique=True),
        sa.Column("kind", sa.String(40), nullable=False, index=True),
        sa.Column("actor", sa.String(120), nullable=False),
        sa.Column("subject_id", sa.String(64), nullable=True, index=True),
        sa.Column("created_at", UTCDateTime(), nullable=False, index=True),
        sa.Column("details", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False, unique=True),
    )
    head = op.create_table(
        "audit_head",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.bulk_insert(head, [{"id": 1, "seq": 0, "hash": GENESIS_HASH}])
    op.create_table(
        "api_tokens",
        sa.Column("token_id", sa.String(36), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("scopes", sa.String(200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
    )
    op.create_table(
        "watermark_keys",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(16), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("retired_at", sa.String(32), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    for table in ("watermark_keys", "api_tokens", "audit_head", "audit_events", "receipts", "verdicts"):
        op.drop_table(table)
