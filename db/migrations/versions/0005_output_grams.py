"""Each remembered output keeps its sampled keyed 5-grams, so the detector can say whether a text repeats an
output's wording after edits that scrubbed its watermark (``detector.output_match``).

Revision ID: 0005_output_grams
Revises: 0004_output_units_per_row
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_output_grams"
down_revision = "0004_output_units_per_row"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("key_outputs") as batch:
        batch.add_column(sa.Column("grams", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("key_outputs") as batch:
        batch.drop_column("grams")
