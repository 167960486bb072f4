"""C2PA manifest stores of generated texts: stored with their audit event, found by id, text or binding.

A manifest is written in the same transaction as its text's receipt (``db.receipts.store_receipt``) and
logged as a ``manifest`` event whose ``subject_sha256`` is the SHA-256 of the manifest store's bytes: the
transparency log's entry names the exact ``.c2pa`` file an outsider holds.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.audit import append_event
from db.audit_rows import row_digest
from db.rows import ManifestRow, utc_now
from db.store import Store

MANIFEST_MEDIA_TYPE = "application/c2pa"
MAX_MATCHES = 100  # rows one lookup returns at most


@dataclass(slots=True, frozen=True)
class ManifestRecord:
    """What is stored of one signed manifest (``soft_binding``: ``"<alg> <value>"`` of its watermark)."""

    manifest_id: str
    receipt_id: str
    text_sha256: str
    embedded: bool
    soft_binding: str | None
    manifest_store: bytes


def add_manifest(session: Session, record: ManifestRecord, actor: str) -> None:
    """Add ``record`` and its ``manifest`` audit event inside the caller's write transaction."""
    store_sha256 = hashlib.sha256(record.manifest_store).hexdigest()
    row = ManifestRow(manifest_id=record.manifest_id, receipt_id=record.receipt_id,
                      text_sha256=record.text_sha256, embedded=record.embedded, soft_binding=record.soft_binding,
                      store_sha256=store_sha256, manifest_store=record.manifest_store, created_at=utc_now())
    session.add(row)
    session.flush()
    append_event(session, "manifest", actor, record.manifest_id,
                 {"receipt_id": record.receipt_id, "subject_sha256": store_sha256, "row_sha256": row_digest(row)})


def get_manifest(store: Store, manifest_id: str) -> ManifestRecord | None:
    with store.read() as session:
        row = session.get(ManifestRow, manifest_id)
        return _record(row) if row is not None else None


def find_manifests(store: Store, *, text_sha256: str | None = None, soft_binding: str | None = None,
                   receipt_id: str | None = None, limit: int = MAX_MATCHES) -> list[ManifestRecord]:
    """Manifests matching every given criterion, newest first, at most ``limit``."""
    query = select(ManifestRow)
    if text_sha256 is not None:
        query = query.where(ManifestRow.text_sha256 == text_sha256)
    if soft_binding is not None:
        query = query.where(ManifestRow.soft_binding == soft_binding)
    if receipt_id is not None:
        query = query.where(ManifestRow.receipt_id == receipt_id)
    with store.read() as session:
        rows = session.scalars(query.order_by(ManifestRow.created_at.desc())
                               .limit(max(1, min(limit, MAX_MATCHES))))
        return [_record(row) for row in rows]


def _record(row: ManifestRow) -> ManifestRecord:
    return ManifestRecord(row.manifest_id, row.receipt_id, row.text_sha256, row.embedded, row.soft_binding,
                          bytes(row.manifest_store))
