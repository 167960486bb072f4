"""Verdicts: what the detector hands the database for one (``VerdictRecord``, validated at the door), the
ONE writer that stores verdicts with their ``detection`` audit events (``record_verdicts``: POST /v1/detect
and batch detection both call it), and the queries: one verdict, pages newest first, CSV export.

A cursor is the (created_at, id) of the last row of a page, base64url JSON: pages stay stable while new
verdicts arrive.

Two views of a row, so a caller never reads colours its scope does not grant. ``exact=True`` (a reader
trusted with colours: the ``explain`` scope, or the operator's CLI) gets the row whole.
``exact=False`` (the ``audit`` scope alone) gets the detect-scope view the
row recorded (``options["disclosed"]``: verdict, coarse dithered z and p, the key only for a shown
``watermarked``), no counts and none of the options that carry exact numbers, and its ``verdict``, ``min_z``
and ``key_id`` filters act on that view (the ``shown_verdict`` and ``shown_z`` columns). Otherwise a token
that may detect and audit would read back the exact G and T of the texts it chose, or bisect their z with
``min_z``. A row whose detect-scope view was never recorded (rows stored before revision 0006 by an ``explain``
caller or a batch) is ``withheld``.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import or_, select

from db import audit
from db.audit_rows import row_digest
from db.caller import Caller
from db.rows import VERDICTS, VerdictRow, iso_utc, new_id, shown_of, utc_now

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
EXACT, WITHHELD = "exact", "withheld"  # the ``disclosure`` of a row read whole, and of one with no recorded view
# what a coarse (audit-only) reader sees of a row's options: the request and which keys were tested
REQUEST_OPTIONS = ("watermark", "keys", "all_keys", "windows", "explain", "normalize", "dedup", "z_threshold", "fpr",
                   "forced_positions", "keys_tested", "source", "disclosed")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(slots=True)
class VerdictRecord:
    """What the detector hands the store for one verdict; validated here, at the door."""

    text_sha256: str
    verdict: str
    z: float
    p_value: float
    green_count: int
    scored_count: int
    green_fraction: float
    spec: str
    spec_fingerprint: str
    tokenizer_fingerprint: str
    key_id: str | None
    options: dict = field(default_factory=dict)
    windows: dict | None = None
    receipt_id: str | None = None

    def __post_init__(self):
        if not isinstance(self.text_sha256, str) or not _SHA256_RE.fullmatch(self.text_sha256):
            raise ValueError("text_sha256 must be 64 lowercase hex digits")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
        for name in ("green_count", "scored_count"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        if self.green_count > self.scored_count:
            raise ValueError("green_count must not exceed scored_count")
        for name in ("z", "p_value", "green_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
                raise ValueError(f"{name} must be a number")
            setattr(self, name, float(value))
        if not 0.0 <= self.p_value <= 1.0 or not 0.0 <= self.green_fraction <= 1.0:
            raise ValueError("p_value and green_fraction must lie in [0, 1]")
        for name in ("spec", "spec_fingerprint", "tokenizer_fingerprint"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if not isinstance(self.options, dict) or not (self.windows is None or isinstance(self.windows, dict)):
            raise ValueError("options must be a dict and windows a dict or None")


@dataclass(slots=True, frozen=True)
class VerdictPage:
    items: list[dict]
    next_cursor: str | None  # None: this was the last page


def record_verdicts(store, records: Sequence[VerdictRecord], caller: Caller,
                    texts: Sequence[str | None] | None = None) -> list[str]:
    """Store verdicts, each with its ``detection`` audit event, in ONE transaction (all or nothing);
    returns the verdict ids in order. ``texts[i]`` (if given) is kept only when the store retains text."""
    if not isinstance(caller, Caller) or not all(isinstance(record, VerdictRecord) for record in records):
        raise TypeError("record_verdicts takes VerdictRecords and a Caller")
    texts = list(texts) if texts is not None else [None] * len(records)
    if len(texts) != len(records):
        raise ValueError("texts: expected one per record")
    ids = []
    with store.write() as session:
        for record, text in zip(records, texts):
            verdict_id = new_id()
            shown_verdict, shown_z = shown_of(record.verdict, record.options)
            row = VerdictRow(id=verdict_id, created_at=utc_now(), text=text if store.retain_text else None,
                             caller_token_id=caller.token_id, caller_name=caller.name,
                             shown_verdict=shown_verdict, shown_z=shown_z,
                             **{name: getattr(record, name) for name in VerdictRecord.__dataclass_fields__})
            session.add(row)
            session.flush()  # the verdict row first: a constraint error leaves no audit event behind
            audit.append_event(session, "detection", caller.actor, verdict_id,
                               {"verdict": record.verdict, "z": record.z, "key_id": record.key_id,
                                "spec_fingerprint": record.spec_fingerprint, "row_sha256": row_digest(row)})
            ids.append(verdict_id)
    return ids


def view(row: VerdictRow, exact: bool) -> dict:
    """A row as a reader sees it (module docstring): whole for ``exact``, else the detect-scope view."""
    if exact:
        return {**row.to_dict(), "disclosure": EXACT}
    out = row.to_dict()
    options = row.options or {}
    disclosed = options.get("disclosed") if isinstance(options.get("disclosed"), dict) else {}
    shown_verdict, shown_z = shown_of(row.verdict, options)
    out.update(verdict=shown_verdict, z=shown_z, p_value=disclosed.get("p_value"), green_count=None,
               scored_count=None, green_fraction=None, windows=disclosed.get("windows"),
               key_id=row.key_id if shown_verdict == "watermarked" else None,
               options={name: options[name] for name in REQUEST_OPTIONS if name in options},
               disclosure=disclosed.get("disclosure", WITHHELD) if shown_verdict is not None else WITHHELD)
    if shown_verdict == "insufficient_text" and not disclosed:
        # no score is shown for an insufficient text in any view (detector.disclosure.DISCLOSURE names the rule)
        out["disclosure"] = "coarse-dithered/v1"
    return out


def get_verdict(store, verdict_id: str, exact: bool = True) -> dict | None:
    with store.read() as session:
        row = session.get(VerdictRow, verdict_id)
        return view(row, exact) if row is not None else None


@dataclass(frozen=True, slots=True)
class VerdictFilter:
    """Which verdicts a listing keeps (each None: any): created in [``since``, ``until``), with this verdict,
    best key, at least this z, or this text hash."""

    since: datetime | None = None
    until: datetime | None = None
    verdict: str | None = None
    key_id: str | None = None
    min_z: float | None = None
    text_sha256: str | None = None


def list_verdicts(store, filters: VerdictFilter = VerdictFilter(), *, cursor: str | None = None,
                  limit: int = DEFAULT_PAGE_SIZE, exact: bool = True) -> VerdictPage:
    """Verdicts newest first, ``filters`` kept (``since`` inclusive, ``until`` exclusive); pass
    ``next_cursor`` back to get the next page. Pages are stable while new verdicts arrive. ``exact=False``:
    the detect-scope view, ``verdict``, ``min_z`` and ``key_id`` on it (module docstring)."""
    since, until, verdict, key_id = filters.since, filters.until, filters.verdict, filters.key_id
    min_z, text_sha256 = filters.min_z, filters.text_sha256
    if not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be an integer in [1, {MAX_PAGE_SIZE}]")
    if verdict is not None and verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
    query = select(VerdictRow)
    if since is not None:
        query = query.where(VerdictRow.created_at >= since)
    if until is not None:
        query = query.where(VerdictRow.created_at < until)
    if verdict is not None:
        query = query.where((VerdictRow.verdict if exact else VerdictRow.shown_verdict) == verdict)
    if key_id is not None:
        query = query.where(VerdictRow.key_id == key_id)
        if not exact:  # the view names the key of a shown watermarked verdict only (which key scored best is not shown)
            query = query.where(VerdictRow.shown_verdict == "watermarked")
    if min_z is not None:
        query = query.where((VerdictRow.z if exact else VerdictRow.shown_z) >= float(min_z))
    if text_sha256 is not None:
        query = query.where(VerdictRow.text_sha256 == text_sha256)
    if cursor is not None:
        after_time, after_id = decode_cursor(cursor)
        query = query.where(
            or_(
                VerdictRow.created_at < after_time,
                (VerdictRow.created_at == after_time) & (VerdictRow.id < after_id),
            )
        )
    query = query.order_by(VerdictRow.created_at.desc(), VerdictRow.id.desc()).limit(limit + 1)
    with store.read() as session:
        rows = list(session.scalars(query))
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = encode_cursor(rows[-1].created_at, rows[-1].id) if more else None
    return VerdictPage([view(row, exact) for row in rows], next_cursor)


def verdicts_csv(store, filters: VerdictFilter = VerdictFilter(), *, limit: int = MAX_PAGE_SIZE,
                 exact: bool = True) -> Iterator[str]:
    """CSV lines (header first) of every verdict ``filters`` keeps, ``limit`` a page."""
    yield _csv_line(CSV_COLUMNS)
    cursor = None
    while True:
        page = list_verdicts(store, filters, cursor=cursor, limit=limit, exact=exact)
        for item in page.items:
            yield _csv_line([_csv_cell(item[name]) for name in CSV_COLUMNS])
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


CSV_COLUMNS = (
    "id", "created_at", "verdict", "z", "p_value", "green_count", "scored_count", "green_fraction",
    "key_id", "spec", "spec_fingerprint", "tokenizer_fingerprint", "text_sha256", "receipt_id",
    "caller_token_id", "caller_name", "options", "windows", "disclosure",
)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    elif isinstance(value, (int, float)):
        return repr(value)
    value = str(value)
    # Spreadsheets run cells starting with these as formulas (OWASP "CSV injection").
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _csv_line(cells) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(cells)
    return buffer.getvalue()


def encode_cursor(created_at: datetime, row_id: str) -> str:
    raw = json.dumps([iso_utc(created_at), row_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) position a cursor stands for; ValueError for anything malformed."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, row_id = json.loads(raw)
        if not isinstance(row_id, str):
            raise TypeError("cursor id is not a string")
        when = datetime.strptime(moment, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    except (ValueError, TypeError, UnicodeDecodeError) as error:
        raise ValueError("malformed cursor") from error
    return when, row_id
