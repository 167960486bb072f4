"""Per-token daily detection usage (the detection budget).

Revision ID: 0002_detection_usage
Revises: 0001_initial
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0002_detection_usage"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "detection_usage",
        sa.Column("token_id", sa.String(36), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("exhausted_at", UTCDateTime(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("detection_usage")
