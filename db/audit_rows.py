"""What the audit log promises about the rows users read: a verdict or receipt row edited, deleted or
added in the database is named by ``audit verify``.

Each ``detection`` and ``generation`` event carries ``row_sha256``: SHA-256 of the canonical JSON of
its row as written (every column but a retained text, which must hash to the row's ``text_sha256``
instead). The event is in the hash chain, so the digest cannot be changed without the event showing
as edited; ``check_rows`` recomputes each row's digest and compares:

    row_edited    the row no longer matches its event (or a retained text no longer matches its hash)
    row_deleted   an event names a row that is not there
    row_unlogged  a row has no event (inserted behind the service's back)

A verdict row's ``shown_verdict`` and ``shown_z`` (what the ``audit`` scope alone reads and filters on) are not
in the digest: they are copies of ``options["disclosed"]``, which is, so they are checked against it instead
(``db.rows.shown_of``), and revision 0006 could fill them in without changing a digest.

Events written by the service before ``row_sha256`` existed still name the fields they carried (verdict, z, key id,
spec fingerprint; a receipt's model, key, token count, spec fingerprint), and those are compared;
such rows are counted in ``AuditReport.rows_partly_covered``, never reported as tampered on that
account alone. An event with neither (written by a tool, not by the service) records no row.

Numbers inside JSON columns are compared as floats: PostgreSQL's JSONB gives a large float back as
an integer, and both sides of the comparison must see one value.
"""

from __future__ import annotations

import hashlib
import json
import math

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.audit_report import AuditProblem
from db.rows import AuditEventRow, ManifestRow, ReceiptRow, VerdictRow, iso_utc, shown_of, text_sha256

ROW_EDITED, ROW_DELETED, ROW_UNLOGGED = "row_edited", "row_deleted", "row_unlogged"
BATCH = 1000
VERDICT_COLUMNS = ("id", "created_at", "text_sha256", "verdict", "z", "p_value", "green_count", "scored_count",
                   "green_fraction", "spec", "spec_fingerprint", "tokenizer_fingerprint", "key_id", "options",
                   "windows", "receipt_id", "caller_token_id", "caller_name")
RECEIPT_COLUMNS = ("receipt_id", "created_at", "text_sha256", "token_count", "model_id", "spec_fingerprint",
                   "key_id", "signer_id", "signature", "stored_at")
MANIFEST_COLUMNS = ("manifest_id", "receipt_id", "text_sha256", "embedded", "soft_binding", "store_sha256",
                    "created_at")
COLUMNS = {VerdictRow: VERDICT_COLUMNS, ReceiptRow: RECEIPT_COLUMNS, ManifestRow: MANIFEST_COLUMNS}
# what events written before row_sha256 carried, and so can still be compared
LEGACY_FIELDS = {"detection": {"verdict": "verdict", "z": "z", "key_id": "key_id",
                               "spec_fingerprint": "spec_fingerprint"},
                 "generation": {"model_id": "model_id", "key_id": "key_id", "token_count": "token_count",
                                "spec_fingerprint": "spec_fingerprint"},
                 "manifest": {}}
TABLES = {"detection": (VerdictRow, VerdictRow.id, VERDICT_COLUMNS, "verdict"),
          "generation": (ReceiptRow, ReceiptRow.receipt_id, RECEIPT_COLUMNS, "receipt"),
          "manifest": (ManifestRow, ManifestRow.manifest_id, MANIFEST_COLUMNS, "manifest")}


def _plain(value):
    """A column value as canonical JSON sees it (times as ISO strings, JSON numbers as floats)."""
    if hasattr(value, "tzinfo"):
        return iso_utc(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(float(value)) else repr(float(value))
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def row_digest(row) -> str:
    """SHA-256 (hex) of a verdict, receipt or manifest row's canonical JSON."""
    columns = COLUMNS[type(row)]
    document = {name: _plain(getattr(row, name)) for name in columns}
    if isinstance(row, ReceiptRow) and row.jws is not None:  # receipts since revision 0008; older digests as they were
        document["jws"] = row.jws
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_rows(session: Session, report, progress=None) -> None:
    """Compare every verdict and receipt row with its event; append problems to ``report``."""
    last_seq = session.scalar(select(func.max(AuditEventRow.seq))) or 0
    for kind, (table, key, _columns, noun) in TABLES.items():
        # events by ranges of seq (the primary key: a planner cannot pick a worse index for it)
        for start in range(0, last_seq, BATCH):
            pairs = session.execute(
                select(AuditEventRow, table).outerjoin(table, key == AuditEventRow.subject_id)
                .where(AuditEventRow.seq > start, AuditEventRow.seq <= start + BATCH, AuditEventRow.kind == kind)
                .order_by(AuditEventRow.seq)).all()
            for event, row in pairs:
                details = _details(event)
                if "row_sha256" not in details and not LEGACY_FIELDS[kind].keys() <= details.keys():
                    continue  # an event that records no row (written by hand or a tool, not the service)
                problem = _compare(kind, noun, event, row, details)
                if problem is not None:
                    report.problems.append(AuditProblem(event.seq, event.event_id, problem[0], problem[1]))
                elif row is not None:
                    report.rows_checked += 1
                    if "row_sha256" not in details:
                        report.rows_partly_covered += 1
            if progress is not None:
                progress(min(BATCH, last_seq - start))
        last = ""
        while True:
            # subject ids are random UUIDs: matching on subject_id alone lets every database use its index
            logged = select(AuditEventRow.seq).where(AuditEventRow.subject_id == key)
            orphans = session.scalars(select(key).where(~logged.exists(), key > last).order_by(key).limit(BATCH)).all()
            for row_id in orphans:
                report.problems.append(AuditProblem(None, None, ROW_UNLOGGED,
                                                    f"{noun} {row_id} has no {kind} event: it was added to the "
                                                    "database outside the service"))
            if len(orphans) < BATCH:
                break
            last = orphans[-1]


def _details(event: AuditEventRow) -> dict:
    try:
        details = json.loads(event.details)
    except (TypeError, ValueError):
        return {}
    return details if isinstance(details, dict) else {}


def _compare(kind: str, noun: str, event: AuditEventRow, row, details: dict) -> tuple[str, str] | None:
    where = f"{noun} {event.subject_id} (audit event {event.seq})"
    if row is None:
        return ROW_DELETED, f"{where} is gone: its row was deleted"
    if "row_sha256" in details:
        if row_digest(row) != details["row_sha256"]:
            return ROW_EDITED, f"{where} was edited: the row no longer matches what its event recorded"
    else:
        for field, column in LEGACY_FIELDS[kind].items():
            if field in details and _plain(details[field]) != _plain(getattr(row, column)):
                return ROW_EDITED, f"{where} was edited: its {column} differs from its event"
    if kind == "manifest" and hashlib.sha256(row.manifest_store).hexdigest() != row.store_sha256:
        return ROW_EDITED, f"{where} was edited: its manifest store does not match its store_sha256"
    if kind == "detection" and row.text is not None and text_sha256(row.text) != row.text_sha256:
        return ROW_EDITED, f"{where} was edited: its retained text does not match its text_sha256"
    if kind == "detection" and (row.shown_verdict, row.shown_z) != shown_of(row.verdict, row.options):
        return ROW_EDITED, f"{where} was edited: its shown verdict or z no longer matches what it recorded"
    return None
