"""What ``audit verify`` reports: each problem found in the chain or in the rows it covers, and the totals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# problems in the chain itself (db/audit.py); the row problems are named in db/audit_rows.py
EDITED, DELETED, REORDERED, HEAD_MISMATCH = "edited", "deleted", "reordered", "head_mismatch"
# problems of the transparency log over the chain: a stale leaf hash (db/audit.py), a kept signed tree head
# the events no longer give, or whose signatures fail (db/audit_heads.py)
LEAF_MISMATCH, TREE_HEAD_MISMATCH, TREE_HEAD_SIGNATURE = "leaf_mismatch", "tree_head_mismatch", "tree_head_signature"


@dataclass(slots=True, frozen=True)
class AuditProblem:
    """One thing wrong with the chain: where (seq, event id) and what (``problem`` + message)."""

    seq: int | None
    event_id: str | None
    problem: str  # edited | deleted | reordered | head_mismatch | leaf_mismatch | tree_head_* | row_* (audit_rows)
    message: str


@dataclass(slots=True)
class AuditReport:
    events: int
    head_seq: int
    head_hash: str
    problems: list[AuditProblem] = field(default_factory=list)
    rows_checked: int = 0  # verdict and receipt rows compared with their events (db.audit_rows)
    rows_partly_covered: int = 0  # of those, rows whose event predates row digests: only some fields compared
    tree_heads_checked: int = 0  # kept signed tree heads compared with the events (db.audit_heads)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"ok": self.ok, "events": self.events, "head_seq": self.head_seq, "head_hash": self.head_hash,
                "rows_checked": self.rows_checked, "rows_partly_covered": self.rows_partly_covered,
                "tree_heads_checked": self.tree_heads_checked, "problems": [asdict(p) for p in self.problems]}
