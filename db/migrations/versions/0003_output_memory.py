"""The generation service's memory of its own output per key: unit counts and the spoof check's null.

Revision ID: 0003_output_memory
Revises: 0002_detection_usage
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0003_output_memory"
down_revision = "0002_detection_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "output_units",
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("unit", sa.BigInteger(), primary_key=True),
        sa.Column("outputs", sa.Integer(), nullable=False),
    )
    op.create_table(
        "key_outputs",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("outputs_before", sa.Integer(), nullable=False),
        sa.Column("z", sa.Float(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_key_outputs_key_id_id", "key_outputs", ["key_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_key_outputs_key_id_id", table_name="key_outputs")
    op.drop_table("key_outputs")
    op.drop_table("output_units")
