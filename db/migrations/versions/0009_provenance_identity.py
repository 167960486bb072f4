"""One provenance identity per deployment: the receipt, log and C2PA keys, sealed under the master key, in the
shared database (``db.identity``) instead of each replica's home.

Revision ID: 0009_provenance_identity
Revises: 0008_receipt_jws_manifests
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0009_provenance_identity"
down_revision = "0008_receipt_jws_manifests"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "signing_keys",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("kid", sa.String(64), nullable=False),
        sa.Column("public_key", sa.String(64), nullable=False),
        sa.Column("created_at", sa.String(32), nullable=False),
        sa.Column("retired_at", sa.String(32), nullable=True),
        sa.Column("certificate", sa.Text(), nullable=True),
        sa.Column("sealed", sa.Text(), nullable=True),
        sa.Column("mac", sa.String(64), nullable=False),
    )
    op.create_index("ix_signing_keys_role", "signing_keys", ["role"])
    op.create_table(
        "deployment_identity",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("deployment_id", sa.String(32), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployment_identity")
    op.drop_index("ix_signing_keys_role", "signing_keys")
    op.drop_table("signing_keys")
