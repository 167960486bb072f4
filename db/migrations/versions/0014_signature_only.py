"""The semantic memory looks outputs up by their words' signatures alone (``db.signature_index``): new rows keep
no passage vector, so the column may be empty. Rows written before keep theirs until retention or a purge deletes
them; nothing reads them.

Revision ID: 0014_signature_only
Revises: 0013_passage_signature
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_signature_only"
down_revision = "0013_passage_signature"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # SQLite alters a column by copying the table: keep its AUTOINCREMENT (row ids are never reused)
    with op.batch_alter_table("output_vectors", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("vector", existing_type=sa.LargeBinary(), nullable=True)


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM output_vectors WHERE vector IS NULL"))
    with op.batch_alter_table("output_vectors", table_kwargs={"sqlite_autoincrement": True}) as batch:
        batch.alter_column("vector", existing_type=sa.LargeBinary(), nullable=False)
