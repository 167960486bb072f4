"""The transparency log over the audit events: an append-only RFC 9162 Merkle tree, its signed heads,
and inclusion and consistency proofs.

Leaf i (from 0) is audit event seq i + 1; its entry is ``db.audit.log_entry`` and its leaf hash, kept
in ``audit_events.leaf_hash``, is written with the event. Signed heads (``provenance.tree_head``) are
kept for good in ``tree_heads``; proofs are bundles of ``provenance.proof_bundle``.

Trees are built from the stored leaf hashes; each process caches the roots of complete chunks of
``CHUNK`` leaves per store (leaves never change once written: the cache is dropped if the last leaf
it covers reads otherwise), so a head over 10^6 events costs about a thousand hashes plus the new
leaves. A new head is signed only if the stored leaves still give the largest kept head's root: the
log never signs a fork of itself. ``db.audit.verify`` checks everything against the events themselves.
"""

from __future__ import annotations

import threading
import time
import weakref

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.audit import lock_chain, row_log_entry
from db.audit_heads import head_of_row
from db.rows import AuditEventRow, AuditHeadRow, TreeHeadRow, utc_now
from db.store import Store
from provenance.log_signer import LogSigner
from provenance.merkle import DEFAULT_CHUNK, ChunkedTree, root_hash
from provenance.proof_bundle import consistency_bundle, inclusion_bundle
from provenance.tree_head import TreeHead, TreeHeadError

CHUNK = DEFAULT_CHUNK
CHUNKS_PER_READ = 16  # leaves read per query while filling the cache: CHUNK * CHUNKS_PER_READ
MAX_EVENT_REF = 64  # longest seq / event id / subject id a lookup accepts


class LogError(Exception):
    """A log request that cannot be answered (a size that is not kept, a damaged log). No secrets."""


class LogNotFound(LogError):
    """No such event, or no kept head of that size."""


class _ChunkRoots:
    """Roots of complete chunks (aligned perfect subtrees of CHUNK leaves) of one store, in order."""

    __slots__ = ("lock", "roots", "witness")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.roots: list[bytes] = []
        self.witness: str | None = None  # the stored leaf hash of the last leaf the roots cover


_chunk_roots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_chunk_roots_lock = threading.Lock()


def _cache_of(store: Store) -> _ChunkRoots:
    with _chunk_roots_lock:
        return _chunk_roots.setdefault(store, _ChunkRoots())


def read_leaf_hashes(session: Session, start: int, end: int) -> list[bytes]:
    """Stored leaf hashes of leaves start..end-1 (events start+1..end); LogError if one is missing."""
    rows = session.execute(select(AuditEventRow.seq, AuditEventRow.leaf_hash)
                           .where(AuditEventRow.seq > start, AuditEventRow.seq <= end)
                           .order_by(AuditEventRow.seq)).all()
    leaves = []
    for expected, (seq, stored) in enumerate(rows, start + 1):
        if seq != expected or stored is None or len(stored) != 64:
            raise LogError(f"the log is damaged at event {expected} (missing, or without its leaf hash): "
                           "run `provmark audit verify`")
        leaves.append(bytes.fromhex(stored))
    if len(leaves) != end - start:
        raise LogError(f"the log is damaged: event {start + len(leaves) + 1} is missing: run `provmark audit verify`")
    return leaves


def log_tree(store: Store, session: Session, size: int) -> ChunkedTree:
    """The tree of the first ``size`` leaves, from the stored leaf hashes (cached chunk roots)."""
    cache, complete = _cache_of(store), size // CHUNK
    with cache.lock:
        if cache.roots and session.scalar(select(AuditEventRow.leaf_hash).where(
                AuditEventRow.seq == len(cache.roots) * CHUNK)) != cache.witness:
            cache.roots, cache.witness = [], None  # another database, or a restored one: start over
        while len(cache.roots) < complete:
            first = len(cache.roots)
            count = min(CHUNKS_PER_READ, complete - first)
            leaves = read_leaf_hashes(session, first * CHUNK, (first + count) * CHUNK)
            cache.roots.extend(root_hash(leaves[i * CHUNK:(i + 1) * CHUNK]) for i in range(count))
            cache.witness = leaves[-1].hex()
        roots = cache.roots[:complete]
    return ChunkedTree(size, roots, lambda i: read_leaf_hashes(session, i * CHUNK, min((i + 1) * CHUNK, size)),
                       CHUNK)


def _log_size(session: Session) -> int:
    return session.scalar(select(AuditHeadRow.seq)) or 0


def _largest_kept(session: Session) -> TreeHeadRow | None:
    return session.scalar(select(TreeHeadRow).order_by(TreeHeadRow.tree_size.desc(), TreeHeadRow.id.desc()).limit(1))


def _newest_kept(session: Session) -> TreeHeadRow | None:
    return session.scalar(select(TreeHeadRow).order_by(TreeHeadRow.id.desc()).limit(1))


def _kept_head(row: TreeHeadRow) -> TreeHead:
    try:
        return head_of_row(row)
    except TreeHeadError as error:
        raise LogError(f"{error}: run `provmark audit verify`") from None


def _recent(row: TreeHeadRow | None, size: int, within_s: float) -> bool:
    return row is not None and (row.tree_size >= size or time.time() * 1000 - row.timestamp < within_s * 1000)


def newest_tree_head(store: Store) -> TreeHead | None:
    """The most recently kept signed head, or None before the first."""
    with store.read() as session:
        row = _newest_kept(session)
        return _kept_head(row) if row is not None else None


def keep_tree_head(store: Store, signer: LogSigner, reuse_within_s: float | None = None) -> TreeHead:
    """Sign a head over every event logged so far and keep it; returns it.

    ``reuse_within_s``: return the newest kept head instead when the log has not grown since, or it is
    younger than this many seconds (so callers cannot flood the table). LogError, and nothing signed,
    when the stored leaves are incomplete or no longer give the largest kept head's root.
    """
    with store.read() as session:
        size = _log_size(session)
        newest = _newest_kept(session)
        if reuse_within_s is not None and _recent(newest, size, reuse_within_s):
            return _kept_head(newest)
        tree = log_tree(store, session, size)
        largest = _largest_kept(session)
        if largest is not None and largest.tree_size <= size and \
                tree.subtree_hash(0, largest.tree_size).hex() != largest.root_hash:
            raise LogError(f"refusing to sign: the stored leaves no longer give the root of kept tree head "
                           f"#{largest.id} (size {largest.tree_size}): run `provmark audit verify`")
        head = signer.sign(size, tree.root())
    with store.write() as session:
        if reuse_within_s is not None:
            lock_chain(session)  # one signer at a time decides; appends wait only for this check
            newest = _newest_kept(session)
            if _recent(newest, size, reuse_within_s):
                return _kept_head(newest)
        session.add(TreeHeadRow(tree_size=head.tree_size, timestamp=head.timestamp, root_hash=head.root_hash.hex(),
                                signature=head.to_dict()["signature"], key_id=head.key_id, log_id=head.log_id,
                                checkpoint=head.checkpoint, created_at=utc_now()))
    return head


def find_event(session: Session, reference) -> AuditEventRow:
    """The event a reference names: a seq (digits), an event id, or a subject id (a receipt, verdict,
    manifest or key id: the newest event about it). LogNotFound if none."""
    text = str(reference).strip()
    if not text or len(text) > MAX_EVENT_REF:
        raise LogNotFound(f"an event reference is 1..{MAX_EVENT_REF} characters: a seq, event id or subject id")
    row = None
    if text.isdigit() and len(text) <= 18:
        row = session.get(AuditEventRow, int(text))
    if row is None:
        row = session.scalar(select(AuditEventRow).where(AuditEventRow.event_id == text))
    if row is None:
        row = session.scalar(select(AuditEventRow).where(AuditEventRow.subject_id == text)
                             .order_by(AuditEventRow.seq.desc()).limit(1))
    if row is None:
        raise LogNotFound(f"no audit event has the seq, event id or subject id {text!r}")
    return row


def _kept_of_size(session: Session, size: int) -> TreeHeadRow:
    row = session.scalar(select(TreeHeadRow).where(TreeHeadRow.tree_size == size)
                         .order_by(TreeHeadRow.id.desc()).limit(1))
    if row is None:
        sizes = session.scalars(select(TreeHeadRow.tree_size).distinct().order_by(TreeHeadRow.tree_size.desc())
                                .limit(5)).all()
        raise LogNotFound(f"no kept tree head has size {size}" +
                          (f" (the largest kept: {', '.join(map(str, sizes))})" if sizes else
                           " (none is kept yet: `provmark audit head` signs one)"))
    return row


def inclusion_proof(store: Store, signer: LogSigner, reference, tree_size: int | None = None) -> dict:
    """The inclusion bundle of the event ``reference`` names (``find_event``) against the kept head of
    ``tree_size``; default: the newest kept head that contains it, else a head signed now."""
    with store.read() as session:
        event = find_event(session, reference)
        if tree_size is not None:
            head_row = _kept_of_size(session, tree_size)
            if tree_size < event.seq:
                raise LogError(f"event {event.seq} is not in the tree of size {tree_size}: it was logged later")
        else:
            head_row = session.scalar(select(TreeHeadRow).where(TreeHeadRow.tree_size >= event.seq)
                                      .order_by(TreeHeadRow.id.desc()).limit(1))
        head = _kept_head(head_row) if head_row is not None else None
    if head is None:
        head = keep_tree_head(store, signer)
    with store.read() as session:
        event = session.get(AuditEventRow, event.seq)
        entry = row_log_entry(event) if event is not None else None
        if entry is None:
            raise LogError(f"event {reference!r} can no longer be read as it was logged: run `provmark audit verify`")
        path = log_tree(store, session, head.tree_size).inclusion_path(event.seq - 1)
    return inclusion_bundle(entry, event.seq - 1, path, head)


def consistency_proof(store: Store, first: int, second: int) -> dict:
    """The consistency bundle between the newest kept heads of sizes ``first`` and ``second``."""
    if not isinstance(first, int) or not isinstance(second, int) or not 0 < first <= second:
        raise LogError(f"a consistency proof needs kept sizes 0 < first <= second, not {first} and {second}")
    with store.read() as session:
        first_head = _kept_head(_kept_of_size(session, first))
        second_head = _kept_head(_kept_of_size(session, second))
        path = log_tree(store, session, second).consistency_proof(first)
    return consistency_bundle(first_head, second_head, path)


def log_size(store: Store) -> int:
    """How many events the log holds (the chain head's seq)."""
    with store.read() as session:
        return _log_size(session)

