"""The transparency log over the audit events: an append-only RFC 9162 Merkle tree, its signed heads,
and inclusion and consistency proofs.

Leaf i (from 0) is audit event seq i + 1; its entry is ``db.audit.log_entry`` and its leaf hash, kept
in ``audit_events.leaf_hash``, is written with the event. Signed heads (``provenance.tree_head``) are
kept for good in ``tree_heads``; proofs are bundles of ``provenance.proof_bundle``.

Trees are built from the stored leaf hashes; each process caches the roots of complete chunks of
``CHUNK`` leaves per store (leaves never change once written: the cache is dropped if the last leaf
it covers reads otherwise), so a head over 10^6 events costs about a thousand hashes plus the new
leaves.

The log never signs a fork of itself (``HeadGuard``): a new head is signed only if the log is at least as
large as every kept head, every kept head verifies under the log key and is a prefix of the stored leaves
(each checked once per signer, then only the new ones; the largest at every signature), and the head
extends the last one this signer signed (kept beside it in a state file, so a rewritten database that
also lost its heads still cannot get new history signed by a signer that signed before). The heads are
signed by the generation service (``HeadSequencer``, every few seconds while the log grows) or by
``provmark log sign``; the detector only serves them. ``db.audit.verify`` checks everything against the
events themselves.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.audit import lock_chain, row_log_entry
from db.audit_heads import head_of_row
from db.rows import AuditEventRow, AuditHeadRow, TreeHeadRow, utc_now
from db.store import Store, StoreUnavailable
from provenance.log_signer import LogSigner
from provenance.merkle import DEFAULT_CHUNK, ChunkedTree, root_hash
from provenance.proof_bundle import consistency_bundle, inclusion_bundle
from provenance.tree_head import TreeHead, TreeHeadError, verify_tree_head
from watermark.paths import write_private_atomic

log = logging.getLogger(__name__)

CHUNK = DEFAULT_CHUNK
CHUNKS_PER_READ = 16  # leaves read per query while filling the cache: CHUNK * CHUNKS_PER_READ
MAX_EVENT_REF = 64  # longest seq / event id / subject id a lookup accepts
SIGNER_STATE_FILE = "log-signer.json"  # in a signer's home: what it last signed (HeadGuard)


class LogError(Exception):
    """A log request that cannot be answered (a size that is not kept, a damaged log). No secrets."""


class LogNotFound(LogError):
    """No such event, or no kept head of that size."""


class LogNotYetSigned(LogError):
    """The event is logged but no signed head covers it yet (heads are signed every few seconds)."""


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


class HeadGuard:
    """What one signer checked before it signs (module docstring): the kept heads it verified (by id) and
    the last head it signed, kept in ``state_file`` when given (JSON, 0600), else in this process only."""

    __slots__ = ("checked_through", "last", "lock", "state_file")

    def __init__(self, state_file: Path | None = None) -> None:
        self.state_file = state_file
        self.lock = threading.Lock()
        self.checked_through = 0
        self.last: tuple[int, str] | None = None  # (tree_size, root hex) of the last head signed
        if state_file is not None and state_file.exists():
            try:
                state = json.loads(state_file.read_text())
                self.checked_through = int(state["checked_through"])
                self.last = (int(state["tree_size"]), str(state["root_hash"]))
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise LogError(f"the log signer's state {state_file} cannot be read ({error}); it is what "
                               "stops this signer from signing a rewritten log: restore it, do not delete it")

    def check(self, session: Session, tree: ChunkedTree, public_key) -> None:
        """LogError unless a head over ``tree`` extends every kept head and the last one signed here."""
        size = tree.size
        largest = _largest_kept(session)
        if largest is not None and largest.tree_size > size:
            raise LogError(f"refusing to sign: kept tree head #{largest.id} covers {largest.tree_size} events but "
                           f"the log holds {size}: events were removed; run `provmark audit verify`")
        if self.last is not None and (self.last[0] > size or tree.subtree_hash(0, self.last[0]).hex() != self.last[1]):
            raise LogError(f"refusing to sign: the log no longer extends the head of size {self.last[0]} this "
                           "signer signed (the database was rewritten or restored); run `provmark audit verify`")
        rows = session.scalars(select(TreeHeadRow).where(TreeHeadRow.id > self.checked_through)
                               .order_by(TreeHeadRow.id)).all()
        if largest is not None and all(row.id != largest.id for row in rows):
            rows.append(largest)  # the leaves under it may have changed since it was checked
        roots: dict[int, str] = {}
        for row in rows:
            try:
                verify_tree_head(_kept_head(row), public_key)
            except TreeHeadError as error:
                raise LogError(f"refusing to sign: kept tree head #{row.id} does not verify under this log's key "
                               f"({error}); run `provmark audit verify`") from None
            if row.tree_size not in roots:
                roots[row.tree_size] = tree.subtree_hash(0, row.tree_size).hex() if row.tree_size else ""
            if row.tree_size and roots[row.tree_size] != row.root_hash:
                raise LogError(f"refusing to sign: the stored leaves no longer give the root of kept tree head "
                               f"#{row.id} (size {row.tree_size}): run `provmark audit verify`")
        if rows:
            self.checked_through = max(self.checked_through, max(row.id for row in rows))

    def signed(self, head: TreeHead) -> None:
        self.last = (head.tree_size, head.root_hash.hex())
        if self.state_file is not None:
            state = {"checked_through": self.checked_through, "tree_size": head.tree_size,
                     "root_hash": head.root_hash.hex(), "checkpoint": head.checkpoint}
            write_private_atomic(self.state_file, (json.dumps(state, indent=2) + "\n").encode())


_guards: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _guard_of(store: Store, signer: LogSigner) -> HeadGuard:
    with _chunk_roots_lock:
        return _guards.setdefault(store, {}).setdefault(signer.origin, HeadGuard())


def keep_tree_head(store: Store, signer: LogSigner, reuse_within_s: float | None = None,
                   guard: HeadGuard | None = None) -> TreeHead:
    """Sign a head over every event logged so far and keep it; returns it.

    ``reuse_within_s``: return the newest kept head instead when the log has not grown since, or it is
    younger than this many seconds (so callers cannot flood the table). ``guard``: what this signer has
    checked and signed before (default: this process's, per store). LogError, and nothing signed, unless
    the head extends every kept head and the last one the guard signed (``HeadGuard``).
    """
    guard = guard if guard is not None else _guard_of(store, signer)
    with guard.lock:
        with store.read() as session:
            size = _log_size(session)
            newest = _newest_kept(session)
            if reuse_within_s is not None and _recent(newest, size, reuse_within_s):
                return _kept_head(newest)
            tree = log_tree(store, session, size)
            guard.check(session, tree, signer.public_key)
            head = signer.sign(size, tree.root())
        with store.write() as session:
            lock_chain(session)  # one signer at a time decides; appends wait only for this check
            largest = _largest_kept(session)
            if largest is not None and largest.tree_size > size:
                raise LogError("refusing to sign: a larger head was kept meanwhile; sign again")
            if reuse_within_s is not None:
                newest = _newest_kept(session)
                if _recent(newest, size, reuse_within_s):
                    return _kept_head(newest)
            session.add(TreeHeadRow(tree_size=head.tree_size, timestamp=head.timestamp,
                                    root_hash=head.root_hash.hex(), signature=head.to_dict()["signature"],
                                    key_id=head.key_id, log_id=head.log_id, checkpoint=head.checkpoint,
                                    created_at=utc_now()))
        guard.signed(head)
    return head


def newest_head(store: Store) -> TreeHead:
    """The newest kept head; LogNotFound before the first is signed."""
    with store.read() as session:
        row = _newest_kept(session)
        if row is None:
            raise LogNotFound("no tree head is signed yet: the generation service signs one within seconds of "
                              "the first event (or run `provmark log sign`)")
        return _kept_head(row)


class HeadSequencer:
    """Signs a head every ``interval_s`` seconds while the log grows, in a daemon thread (one per signing
    process; several are safe: each checks before it signs, and the newest recent head is reused)."""

    def __init__(self, store: Store, signer: LogSigner, interval_s: float, guard: HeadGuard | None = None):
        self.store, self.signer, self.interval_s, self.guard = store, signer, interval_s, guard
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="provmark-log-heads", daemon=True)
        self.failure: str | None = None

    def start(self) -> HeadSequencer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                keep_tree_head(self.store, self.signer, reuse_within_s=self.interval_s, guard=self.guard)
                self.failure = None
            except LogError as error:  # refused: a fork or damage; said once per change, retried
                if str(error) != self.failure:
                    log.error("transparency log: %s", error)
                self.failure = str(error)
            except StoreUnavailable as error:  # the database is away for a moment: the next round retries
                log.warning("transparency log: no head signed this round: %s", error)


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


def inclusion_proof(store: Store, signer: LogSigner | None, reference, tree_size: int | None = None) -> dict:
    """The inclusion bundle of the event ``reference`` names (``find_event``) against the kept head of
    ``tree_size``; default: the newest kept head that contains it, else (with a ``signer``) a head signed
    now, else LogNotYetSigned."""
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
    if head is None and signer is None:
        raise LogNotYetSigned(f"event {event.seq} is logged but no signed tree head covers it yet: heads are "
                              "signed every few seconds; ask again shortly")
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

