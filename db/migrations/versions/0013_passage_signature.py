"""Each remembered output also keeps its words as keyed stem hashes (``db.passage_signature``): the semantic match
confirms a candidate the passage vectors found by comparing signatures exactly. Rows written before have none and
are never named.

Revision ID: 0013_passage_signature
Revises: 0012_passage_vector_form
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_passage_signature"
down_revision = "0012_passage_vector_form"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("output_vectors", sa.Column("signature", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("output_vectors") as batch:
        batch.drop_column("signature")
