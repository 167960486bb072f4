"""Each remembered output's vector says which recipe made it (``db.passage_vectors.FORM``): form 2 adds the
text's words (a TF-IDF count sketch) to its meaning. Rows written before keep form 1; the detector compares a
text only with rows of its own form, so old rows stop matching and leave with the key's retention or a purge.

Revision ID: 0012_passage_vector_form
Revises: 0011_semantic_memory
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_passage_vector_form"
down_revision = "0011_semantic_memory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("output_vectors", sa.Column("form", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("output_vectors") as batch:
        batch.drop_column("form")
