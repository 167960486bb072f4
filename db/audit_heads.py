"""What ``audit verify`` checks of the kept signed tree heads (``tree_heads``, written by ``db.transparency``).

As ``db.audit.verify`` walks the events it grows a Merkle tree from each event's entry as it reads now
(never from the stored leaf hashes); each kept head of size n is compared with that tree's root at n:

    tree_head_mismatch    the events no longer give the head's root (an event edited, deleted or
                          reordered after the head was signed), or the head covers more events than remain
    tree_head_signature   the head's TLS signature or checkpoint signature fails under the log key, or
                          there is no log key to check it with

The log key is the caller's: the deployment's (``db.identity``); without one no signature is checked and
the report says so.
"""

from __future__ import annotations

import base64
import binascii

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from db.audit_report import TREE_HEAD_MISMATCH, TREE_HEAD_SIGNATURE, AuditProblem
from db.rows import TreeHeadRow
from provenance.merkle import MerkleAccumulator
from provenance.tree_head import TreeHead, TreeHeadError, verify_tree_head

HEAD_BATCH = 1000  # heads read per query: bounded memory however many were signed


def head_of_row(row: TreeHeadRow) -> TreeHead:
    """The signed head a row keeps; TreeHeadError if a column no longer decodes."""
    try:
        root, signature = bytes.fromhex(row.root_hash), base64.b64decode(row.signature, validate=True)
    except (TypeError, ValueError, binascii.Error):
        raise TreeHeadError(f"tree head #{row.id} has an undecodable root or signature") from None
    return TreeHead(row.tree_size, row.timestamp, root, signature, row.key_id, row.log_id, row.checkpoint)


class KeptHeadCheck:
    """The kept heads in tree-size order, compared as the walk's tree reaches each one's size."""

    __slots__ = ("_after", "_key", "_no_key_reason", "_pending", "_session", "_unchecked_signatures", "checked")

    def __init__(self, session: Session, log_key: Ed25519PublicKey | None = None) -> None:
        self._session, self._key = session, log_key
        self._pending: list[TreeHeadRow] = []
        self._after: tuple[int, int] = (-1, 0)  # (tree_size, id) of the last head read
        self._unchecked_signatures = 0
        self._no_key_reason = "no log key was given (the database has no provenance identity)"
        self.checked = 0
        self._read_more()

    def _read_more(self) -> None:
        rows = self._session.scalars(
            select(TreeHeadRow).where(tuple_(TreeHeadRow.tree_size, TreeHeadRow.id) > self._after)
            .order_by(TreeHeadRow.tree_size, TreeHeadRow.id).limit(HEAD_BATCH)).all()
        if rows:
            self._after = (rows[-1].tree_size, rows[-1].id)
        self._pending = list(reversed(rows))  # popped from the end: smallest first

    def _next(self) -> TreeHeadRow | None:
        if not self._pending:
            self._read_more()
        return self._pending[-1] if self._pending else None

    def check_at(self, tree: MerkleAccumulator) -> list[AuditProblem]:
        """Problems of every kept head of exactly ``tree.size`` leaves."""
        problems = []
        while (row := self._next()) is not None and row.tree_size <= tree.size:
            self._pending.pop()
            self.checked += 1
            head_problem = self._signature_problem(row)
            if head_problem is not None:
                problems.append(head_problem)
            if row.tree_size == tree.size and row.root_hash != tree.root().hex():
                problems.append(AuditProblem(None, None, TREE_HEAD_MISMATCH, f"{_named(row)} no longer matches the "
                                             f"events: events 1..{row.tree_size} as they read now give another "
                                             "root (an event was edited, deleted or reordered after it was signed)"))
        return problems

    def finish(self, tree: MerkleAccumulator) -> list[AuditProblem]:
        """Problems of the heads larger than the log, and of signatures there was no key for."""
        problems = []
        while (row := self._next()) is not None:
            self._pending.pop()
            self.checked += 1
            head_problem = self._signature_problem(row)
            if head_problem is not None:
                problems.append(head_problem)
            problems.append(AuditProblem(None, None, TREE_HEAD_MISMATCH,
                                         f"{_named(row)} covers {row.tree_size} events but the log holds "
                                         f"{tree.size}: events were deleted after it was signed"))
        if self._unchecked_signatures:
            problems.append(AuditProblem(None, None, TREE_HEAD_SIGNATURE,
                                         f"{self._unchecked_signatures} kept tree head(s) cannot be checked: "
                                         f"{self._no_key_reason}"))
        return problems

    def _signature_problem(self, row: TreeHeadRow) -> AuditProblem | None:
        key = self._key
        if key is None:
            self._unchecked_signatures += 1
            return None
        try:
            verify_tree_head(head_of_row(row), key)
        except TreeHeadError as error:
            return AuditProblem(None, None, TREE_HEAD_SIGNATURE, f"{_named(row)} does not verify: {error}")
        return None


def _named(row: TreeHeadRow) -> str:
    return f"tree head #{row.id} (size {row.tree_size}, timestamp {row.timestamp})"
