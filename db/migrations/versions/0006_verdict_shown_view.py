"""Each verdict row carries the detect-scope view it recorded (shown verdict and z) as columns, so the
``audit`` scope alone reads and filters on that view, never on the exact numbers (``db.verdicts``).

The values are copies of ``options["disclosed"]`` (an insufficient text is one in every view; a row that
recorded no view stays NULL: withheld from the audit scope). No row digest changes.

Revision ID: 0006_verdict_shown_view
Revises: 0005_output_grams
Create Date: 2026-11-26
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0006_verdict_shown_view"
down_revision = "0005_output_grams"
branch_labels = None
depends_on = None

BATCH = 1000
VERDICTS = ("watermarked", "not_watermarked", "insufficient_text")


def upgrade() -> None:
    with op.batch_alter_table("verdicts") as batch:
        batch.add_column(sa.Column("shown_verdict", sa.String(32), nullable=True))
        batch.add_column(sa.Column("shown_z", sa.Float(), nullable=True))
        batch.create_index("ix_verdicts_shown_verdict", ["shown_verdict"])
    connection = op.get_bind()
    verdicts = sa.table("verdicts", sa.column("id", sa.String), sa.column("verdict", sa.String),
                        sa.column("options", sa.Text), sa.column("shown_verdict", sa.String),
                        sa.column("shown_z", sa.Float))
    last = ""
    while True:  # in primary-key order, a batch at a time: a large table is never held in memory at once
        rows = connection.execute(sa.select(verdicts.c.id, verdicts.c.verdict, verdicts.c.options)
                                  .where(verdicts.c.id > last).order_by(verdicts.c.id).limit(BATCH)).all()
        for row_id, verdict, options in rows:
            shown = _shown(verdict, options)
            if shown != (None, None):
                connection.execute(verdicts.update().where(verdicts.c.id == row_id)
                                   .values(shown_verdict=shown[0], shown_z=shown[1]))
        if len(rows) < BATCH:
            break
        last = rows[-1][0]


def _shown(verdict: str, options) -> tuple:
    """What ``db.rows.shown_of`` gives, as of this revision (kept here: a migration must not change later)."""
    if isinstance(options, (str, bytes)):
        try:
            options = json.loads(options)
        except ValueError:
            options = None
    disclosed = options.get("disclosed") if isinstance(options, dict) else None
    if isinstance(disclosed, dict) and disclosed.get("verdict") in VERDICTS:
        z = disclosed.get("z_score")
        return disclosed["verdict"], None if z is None else float(z)
    if verdict == "insufficient_text":
        return verdict, None
    return None, None


def downgrade() -> None:
    with op.batch_alter_table("verdicts") as batch:
        batch.drop_index("ix_verdicts_shown_verdict")
        batch.drop_column("shown_z")
        batch.drop_column("shown_verdict")
