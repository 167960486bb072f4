"""Each remembered output keeps its distinct unit identities, so a detector worker follows the memory by its
new rows instead of querying the counts for every positive verdict (``db.output_memory.MemoryMirror``).

Revision ID: 0004_output_units_per_row
Revises: 0003_output_memory
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_output_units_per_row"
down_revision = "0003_output_memory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("key_outputs") as batch:
        batch.add_column(sa.Column("units", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("key_outputs") as batch:
        batch.drop_column("units")
