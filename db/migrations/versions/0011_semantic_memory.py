"""Each remembered output keeps its meaning as a rotated, quantised passage embedding (no text), so the detector
can say that a text restates one of the service's outputs in other words (``paraphrase_of_own_output``).

Revision ID: 0011_semantic_memory
Revises: 0009_provenance_identity
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from db.rows import UTCDateTime

revision = "0011_semantic_memory"
down_revision = "0009_provenance_identity"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "output_vectors",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("receipt_id", sa.String(36), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sqlite_autoincrement=True,  # ids never reused: a detector worker's copy tells a purge by them
    )
    op.create_index("ix_output_vectors_key_id_id", "output_vectors", ["key_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_output_vectors_key_id_id", table_name="output_vectors")
    op.drop_table("output_vectors")
