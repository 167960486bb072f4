"""The audit log: append-only events in one hash chain, and its verification.

Each event's ``hash`` is SHA-256 of the canonical JSON (sorted keys, no whitespace, UTF-8) of::

    {"prev_hash", "event_id", "kind", "actor", "subject_id", "created_at", "details"}

where ``prev_hash`` is the previous event's hash (``GENESIS_HASH`` for the first) and ``created_at`` is
``YYYY-MM-DDTHH:MM:SS.ffffffZ``. Order is fixed by those links; ``seq`` numbers the events 1, 2, 3...
The ``audit_head`` row holds the last seq and hash: appenders lock it (``SELECT ... FOR UPDATE`` on
PostgreSQL; on SQLite the write transaction's ``BEGIN IMMEDIATE`` already excludes other writers), so
appends from many processes form one chain, and deleting the newest events is still noticed.

``append_event`` runs inside the caller's ``Store.write()`` transaction, so an event and the row it
describes commit together or not at all. Call it last in the transaction: the head lock is held until
commit. Details name things (ids, scores); they never hold secrets or texts.

Each event is also a leaf of the transparency log (``db.transparency``): its ``leaf_hash`` is
SHA-256(0x00 || ``log_entry``), written with the event. ``verify`` also checks every leaf hash and every
kept signed tree head (``db.audit_heads``), so a chain rewritten consistently, head included, is still
caught once a head it contradicts was signed; publish the signed heads to anchor them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from db.audit_heads import KeptHeadCheck
from db.audit_report import (
    DELETED,
    EDITED,
    HEAD_MISMATCH,
    LEAF_MISMATCH,
    REORDERED,
    AuditProblem,
    AuditReport,
)
from db.audit_rows import check_rows
from db.rows import AuditEventRow, AuditHeadRow, iso_utc, new_id, utc_now
from provenance.merkle import MerkleAccumulator, leaf_hash

GENESIS_HASH = hashlib.sha256(b"provmark/audit/genesis").hexdigest()
HEAD_ROW_ID = 1
VERIFY_BATCH = 1000  # rows read per query while verifying: bounded memory for long chains
KIND_RULE = r"generation|detection|manifest|(key|token)\.[a-z][a-z_]{0,30}"
_KIND_RE = re.compile(KIND_RULE)
# Detail keys that would smuggle secrets or texts into a log meant to be shown to auditors.
FORBIDDEN_DETAIL_KEYS = frozenset({"text", "secret", "plaintext", "token", "password", "master_key"})


class AuditError(Exception):
    """An event that cannot be appended (bad kind or details)."""


@dataclass(slots=True, frozen=True)
class AuditEvent:
    seq: int
    event_id: str
    kind: str
    actor: str
    subject_id: str | None
    created_at: str
    details: dict
    prev_hash: str
    hash: str

    def to_dict(self) -> dict:
        return asdict(self)


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no NaN: the same bytes for the same value everywhere."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def event_hash(prev_hash: str, event_id: str, kind: str, actor: str, subject_id: str | None,
               created_at: str, details: dict) -> str:
    """The chain hash of one event (see the module docstring for the exact document)."""
    document = {"prev_hash": prev_hash, "event_id": event_id, "kind": kind, "actor": actor,
                "subject_id": subject_id, "created_at": created_at, "details": details}
    return hashlib.sha256(canonical_json(document)).hexdigest()


def log_entry(seq: int, event_id: str, kind: str, subject_id: str | None, created_at: str, details,
              chain_hash: str) -> bytes:
    """The event as a transparency-log entry: canonical JSON of {"v": 1, "seq", "event_id", "kind",
    "subject_id", "subject_sha256", "created_at", "event_hash"}. ``event_hash`` is the chain hash (it
    commits to actor and details, which the entry need not show); ``subject_sha256`` is the details'
    ``subject_sha256``, else their ``row_sha256``, else null."""
    details = details if isinstance(details, dict) else {}
    subject_sha256 = details["subject_sha256"] if "subject_sha256" in details else details.get("row_sha256")
    return canonical_json({"v": 1, "seq": seq, "event_id": event_id, "kind": kind, "subject_id": subject_id,
                           "subject_sha256": subject_sha256, "created_at": created_at, "event_hash": chain_hash})


def row_log_entry(row: AuditEventRow) -> bytes | None:
    """The log entry of a stored event as it reads now (its chain hash recomputed); None if unreadable."""
    chain_hash = _recomputed_hash(row)
    if chain_hash is None:
        return None
    return log_entry(row.seq, row.event_id, row.kind, row.subject_id, iso_utc(row.created_at),
                     json.loads(row.details), chain_hash)


def lock_chain(session: Session) -> AuditHeadRow:
    """Lock and return the chain head: call first in check-then-write transactions that append."""
    query = select(AuditHeadRow).where(AuditHeadRow.id == HEAD_ROW_ID).with_for_update()
    return session.execute(query.execution_options(populate_existing=True)).scalar_one()


def append_event(session: Session, kind: str, actor: str, subject_id: str | None,
                 details: dict) -> AuditEvent:
    """Append one event inside the caller's write transaction; it commits or rolls back with it."""
    if not isinstance(kind, str) or not _KIND_RE.fullmatch(kind):
        raise AuditError(f"audit kind must match {KIND_RULE}")
    if not isinstance(actor, str) or not actor or len(actor) > 120:
        raise AuditError("audit actor must be a non-empty string of at most 120 characters")
    if not isinstance(details, dict) or FORBIDDEN_DETAIL_KEYS & set(details):
        raise AuditError(f"audit details must be a dict without the keys {sorted(FORBIDDEN_DETAIL_KEYS)}")
    try:
        details_json = canonical_json(details).decode()
    except (TypeError, ValueError) as error:
        raise AuditError("audit details must be JSON (no NaN, no objects)") from error
    details = json.loads(details_json)  # hash exactly what a reader will get back
    head = lock_chain(session)
    event_id, created_at = new_id(), utc_now()
    digest = event_hash(head.hash, event_id, kind, actor, subject_id, iso_utc(created_at), details)
    entry = log_entry(head.seq + 1, event_id, kind, subject_id, iso_utc(created_at), details, digest)
    row = AuditEventRow(seq=head.seq + 1, event_id=event_id, kind=kind, actor=actor, subject_id=subject_id,
                        created_at=created_at, details=details_json, prev_hash=head.hash, hash=digest,
                        leaf_hash=leaf_hash(entry).hex())
    session.add(row)
    head.seq, head.hash = row.seq, digest
    session.flush()
    return _to_event(row)


def list_events(store, after_seq: int = 0, limit: int = 100, kind: str | None = None,
                subject_id: str | None = None) -> list[AuditEvent]:
    """Events in chain order after ``after_seq`` (pass the last seq seen to page on)."""
    if not isinstance(limit, int) or not 1 <= limit <= VERIFY_BATCH:
        raise ValueError(f"limit must be an integer in [1, {VERIFY_BATCH}]")
    query = select(AuditEventRow).where(AuditEventRow.seq > after_seq)
    if kind is not None:
        query = query.where(AuditEventRow.kind == kind)
    if subject_id is not None:
        query = query.where(AuditEventRow.subject_id == subject_id)
    with store.read() as session:
        return [_to_event(row) for row in session.scalars(query.order_by(AuditEventRow.seq).limit(limit))]


def verify(store, progress=None, log_key: Ed25519PublicKey | None = None) -> AuditReport:
    """Walk the whole chain; report every edited, deleted or reordered event by seq and id, every stored
    leaf hash that no longer matches its event, every kept tree head whose root the events no longer give
    or whose signatures fail under ``log_key`` (the deployment's; see ``db.audit_heads``), then every verdict
    or receipt row that disagrees with its event, lost its row
    or has no event (audit_rows).

    Reads one consistent snapshot (SQLite WAL read transaction, PostgreSQL REPEATABLE READ), so it
    can run while other workers append. ``progress(steps)`` (e.g. a tqdm bar's ``update``) is called as
    batches are done: 3 x head seq steps in all (the chain, then the verdict and the receipt rows).
    """
    with store.read() as session:
        if store.dialect == "postgresql":  # one snapshot for head and events while others append
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        head = session.get(AuditHeadRow, HEAD_ROW_ID)
        report = AuditReport(events=0, head_seq=head.seq, head_hash=head.hash)
        expected_seq, last_hash, last_flagged = 1, GENESIS_HASH, False
        tree, kept_heads = MerkleAccumulator(), KeptHeadCheck(session, log_key)
        report.problems.extend(kept_heads.check_at(tree))
        while True:
            batch = list(session.scalars(
                select(AuditEventRow).where(AuditEventRow.seq >= expected_seq)
                .order_by(AuditEventRow.seq).limit(VERIFY_BATCH)
            ))
            for row in batch:
                report.events += 1
                problems = _check_row(session, row, expected_seq, last_hash, last_flagged)
                report.problems.extend(problems)
                expected_seq, last_hash, last_flagged = row.seq + 1, row.hash, bool(problems)
                report.problems.extend(_check_leaf(row, tree, reported=any(p.seq == row.seq for p in problems)))
                report.problems.extend(kept_heads.check_at(tree))
            if progress is not None:
                progress(len(batch))
            if len(batch) < VERIFY_BATCH:
                break
        last_seq = expected_seq - 1
        if head.seq > last_seq:
            report.problems.append(AuditProblem(
                last_seq + 1, None, DELETED,
                f"events {last_seq + 1}..{head.seq} are missing at the end of the chain (deleted)"))
        elif head.seq != last_seq or head.hash != last_hash:
            report.problems.append(AuditProblem(
                None, None, HEAD_MISMATCH,
                f"the chain head says seq {head.seq} but the last event is seq {last_seq} with another hash"))
        report.problems.extend(kept_heads.finish(tree))
        report.tree_heads_checked = kept_heads.checked
        check_rows(session, report, progress)
    return report


def _check_row(session: Session, row: AuditEventRow, expected_seq: int, last_hash: str,
               last_flagged: bool) -> list[AuditProblem]:
    problems = []
    gap = row.seq != expected_seq
    if gap:
        missing = f"event {expected_seq} is" if row.seq == expected_seq + 1 else \
            f"events {expected_seq}..{row.seq - 1} are"
        problems.append(AuditProblem(expected_seq, None, DELETED, f"{missing} missing (deleted)"))
    if _recomputed_hash(row) != row.hash:
        problems.append(AuditProblem(row.seq, row.event_id, EDITED,
                                     f"event {row.seq} ({row.event_id}) was edited: its content does not "
                                     "match its hash"))
    if row.prev_hash != last_hash and not gap and not last_flagged:
        chained_after = session.scalar(select(AuditEventRow.seq).where(AuditEventRow.hash == row.prev_hash))
        if chained_after is not None:
            problems.append(AuditProblem(row.seq, row.event_id, REORDERED,
                                         f"event {row.seq} ({row.event_id}) is out of order: it was appended "
                                         f"after event {chained_after}, not after event {row.seq - 1}"))
        else:
            problems.append(AuditProblem(row.seq, row.event_id, EDITED,
                                         f"event {row.seq} ({row.event_id}) does not follow event "
                                         f"{row.seq - 1}: a previous event was replaced or its link edited"))
    return problems


def _check_leaf(row: AuditEventRow, tree: MerkleAccumulator, reported: bool) -> list[AuditProblem]:
    """Grow ``tree`` by the event as it reads now; a stored leaf hash that disagrees is a problem, unless
    the event itself was already ``reported`` (one edit, one problem: its leaf changed with it)."""
    entry = row_log_entry(row)
    leaf = leaf_hash(entry) if entry is not None else bytes(32)  # unreadable: a leaf no head can contain
    tree.append(leaf)
    if reported or row.leaf_hash == leaf.hex():
        return []
    return [AuditProblem(row.seq, row.event_id, LEAF_MISMATCH,
                         f"event {row.seq} ({row.event_id}) no longer matches its transparency-log leaf hash"
                         if row.leaf_hash else f"event {row.seq} ({row.event_id}) has no transparency-log leaf hash")]


def _recomputed_hash(row: AuditEventRow) -> str | None:
    try:
        details = json.loads(row.details)
        return event_hash(row.prev_hash, row.event_id, row.kind, row.actor, row.subject_id,
                          iso_utc(row.created_at), details)
    except (TypeError, ValueError):
        return None  # unparsable details or time: certainly edited


def _to_event(row: AuditEventRow) -> AuditEvent:
    return AuditEvent(row.seq, row.event_id, row.kind, row.actor, row.subject_id, iso_utc(row.created_at),
                      json.loads(row.details), row.prev_hash, row.hash)
