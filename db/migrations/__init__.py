"""Alembic migrations for the detector store, runnable without an ``alembic.ini``.

``upgrade_to_head(engine)`` brings any database (empty or older) to the newest schema inside one
transaction that first takes a lock (PostgreSQL: a transaction-level advisory lock; SQLite:
``BEGIN IMMEDIATE``), so several workers starting at once migrate it exactly once.
Developers add a revision with ``alembic -x url=sqlite:///dev.db -c /dev/null revision -m "..."``
(script location: this folder); revisions are plain files in ``versions/``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

MIGRATIONS_DIR = Path(__file__).resolve().parent
# Any fixed 64-bit number unique to this purpose; ASCII "provmig1".
MIGRATION_LOCK_ID = int.from_bytes(b"provmig1", "big") & 0x7FFF_FFFF_FFFF_FFFF


def alembic_config() -> Config:
    """An in-memory Alembic config pointing at this folder."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at, None when it has never been migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade_to_head(write_engine: Engine) -> str:
    """Migrate to the newest revision in one locked transaction; returns that revision.

    ``write_engine`` must begin SQLite transactions with ``BEGIN IMMEDIATE`` (``Store.write_engine``).
    """
    config = alembic_config()
    with write_engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_ID})")
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        return MigrationContext.configure(connection).get_current_revision()
