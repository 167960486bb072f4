"""Receipts carry their compact JWS; C2PA manifest stores of generated texts get a table.

A receipt row written before keeps ``jws`` NULL and its row digest unchanged (``db.audit_rows`` adds the JWS
to a receipt's digest only when there is one).

Revision ID: 0008_receipt_jws_manifests
Revises: 0007_transparency_log
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0008_receipt_jws_manifests"
down_revision = "0007_transparency_log"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("receipts") as batch:
        batch.add_column(sa.Column("jws", sa.Text(), nullable=True))
    op.create_table(
        "c2pa_manifests",
        sa.Column("manifest_id", sa.String(100), primary_key=True),
        sa.Column("receipt_id", sa.String(36), nullable=False),
        sa.Column("text_sha256", sa.String(64), nullable=False),
        sa.Column("embedded", sa.Boolean(), nullable=False),
        sa.Column("soft_binding", sa.String(200), nullable=True),
        sa.Column("store_sha256", sa.String(64), nullable=False),
        sa.Column("manifest_store", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_c2pa_manifests_receipt_id", "c2pa_manifests", ["receipt_id"])
    op.create_index("ix_c2pa_manifests_text_sha256", "c2pa_manifests", ["text_sha256"])
    op.create_index("ix_c2pa_manifests_soft_binding", "c2pa_manifests", ["soft_binding"])


def downgrade() -> None:
    op.drop_table("c2pa_manifests")
    with op.batch_alter_table("receipts") as batch:
        batch.drop_column("jws")
