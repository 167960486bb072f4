"""The database both services share: verdicts, receipts, the hash-chained audit log, API tokens, key metadata,
the detection budget table and the Alembic migrations. Imports watermark only."""
