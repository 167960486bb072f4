"""Alembic environment: runs on the connection ``upgrade_to_head`` passes in, or on ``-x url=...``."""

from alembic import context
from sqlalchemy import create_engine

from db.rows import Base

config = context.config
target_metadata = Base.metadata


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database: pass -x url=... or call db.migrations.upgrade_to_head")
    with create_engine(url).begin() as own_connection:
        _run_on(own_connection)


def _run_on(connection) -> None:
    # render_as_batch: SQLite can only ALTER tables by copying them; autogenerate should emit that.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
