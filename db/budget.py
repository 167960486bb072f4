"""The detection budget: tokens scored per UTC day per API token, shared by every worker.

The request rate limit (``api.http.RateLimiter``) is per process and per minute: it bounds load, not
what a caller learns. Every verdict a ``detect`` caller reads is a noisy look at the key's colours,
so what bounds an oracle attack is how much text a token may have scored in a day. Usage lives in the
shared database (``detection_usage``: one row per token and day, updated by an atomic upsert), so
gunicorn workers and both services count against one total.

* Each detection is charged ``max(tokens of the text, MIN_CHARGE_TOKENS)``: a short text costs as
  much as a paragraph, so the cheap short-text oracle is not cheap any more. The charge is made before
  any work on the text, from its length (``estimate_for``: one token per character), and settled to the
  tokens scored once the verdict is in; a detection refused for its options or keys keeps the minimum.
* A request is refused (429, ``Retry-After`` = seconds to the next UTC midnight) once the day's usage
  has reached the budget; the request that crosses it is still answered (one text's overshoot at most
  per worker).
* Crossing the budget appends one ``token.budget_exhausted`` audit event per token and day.
* Tokens with the ``explain`` scope (and ``admin``) are not budgeted: they may read colours directly.
* Each process batches its charges (``UsageLedger``): far from a token's budget they reach the database
  when a batch (``flush_tokens``: FLUSH_TOKENS, or FLUSH_SHARE of a larger budget) has gathered or
  FLUSH_SECONDS have passed, in a transaction of their own, so the verdict's transaction (the audit chain's
  lock, the service's ceiling) is not lengthened; within one batch of the budget every charge is written at
  once. A token can overshoot by what other workers hold unwritten: at most (workers - 1) batches, i.e.
  (workers - 1) * FLUSH_TOKENS for the default budget and a hundredth of the budget per other worker for a
  bulk token's, whose writes the batch interval bounds instead (one a second per worker, where a fixed
  4,000-token batch wrote after every fourth 1,000-token text and cost 3-10 % of the service's rate).

Configuration: ``PROVMARK_DETECT_BUDGET`` tokens per day per API token (default ``DEFAULT_DAILY_TOKENS``;
0 turns the budget off). docs/security.md says what the default buys.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from db.audit import append_event
from db.caller import Caller
from db.rows import DetectionUsageRow, utc_now
from db.store import Store

DEFAULT_DAILY_TOKENS = 40_000  # 200 texts of 200 tokens a day; the measured oracle needs 105 k for 2 units (docs/security.md)
MIN_CHARGE_TOKENS = 200  # a 5-token text is charged as a 200-token one
EXHAUSTED_EVENT = "token.budget_exhausted"
FLUSH_TOKENS = 4_000  # a process's unwritten charges per token, at most (and the margin written through)
FLUSH_SHARE = 0.01  # ... or this share of a budget larger than FLUSH_TOKENS / FLUSH_SHARE
FLUSH_SECONDS = 1.0  # and at most this old


def flush_tokens(daily_tokens: int) -> int:
    """The batch a process may hold unwritten for one token under ``daily_tokens`` a day, which is also the
    margin below the budget where every charge is written at once."""
    return max(FLUSH_TOKENS, int(daily_tokens * FLUSH_SHARE))


def charge_for(num_tokens: int) -> int:
    """What one detection of a text of ``num_tokens`` tokens costs."""
    return max(int(num_tokens), MIN_CHARGE_TOKENS)


def estimate_for(text: str) -> int:
    """What a detection of ``text`` is charged before any work on it: one token per character (no fewer than
    ``charge_for`` asks), settled to the tokens actually scored once it is done. Prose tokenizes to about one
    token per 4-5 characters, so the estimate is high while the work runs and falls back after."""
    return charge_for(len(text))


def day_of(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d")


def seconds_to_next_day(moment: datetime) -> int:
    midnight = (moment + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, int((midnight - moment).total_seconds()) + 1)


def used_today(store: Store, token_id: str, now: datetime | None = None) -> int:
    """Tokens charged to ``token_id`` on the current UTC day."""
    day = day_of(now or utc_now())
    with store.read() as session:
        found = session.scalar(select(DetectionUsageRow.tokens).where(
            DetectionUsageRow.token_id == token_id, DetectionUsageRow.day == day))
    return int(found or 0)


def retry_after(store: Store, token_id: str, daily_tokens: int, now: datetime | None = None) -> int:
    """0 when ``token_id`` may detect now, else the seconds until its budget resets."""
    now = now or utc_now()
    if daily_tokens <= 0 or used_today(store, token_id, now) < daily_tokens:
        return 0
    return seconds_to_next_day(now)


def charge(store: Store, caller: Caller, tokens: int, daily_tokens: int, now: datetime | None = None) -> int:
    """Add ``tokens`` to the caller's usage today in a transaction of its own; returns the new total."""
    with store.write() as session:
        return charge_in(session, caller, tokens, daily_tokens, now)


def charge_in(session: Session, caller: Caller, tokens: int, daily_tokens: int, now: datetime | None = None) -> int:
    """``charge`` inside the caller's write transaction (the service charges in the verdict's own, so a
    detection costs no extra commit): one atomic upsert; the charge that reaches ``daily_tokens`` also
    appends the audit event."""
    if caller.token_id is None:
        return 0
    now = now or utc_now()
    day = day_of(now)
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    statement = insert(DetectionUsageRow).values(token_id=caller.token_id, day=day, tokens=tokens)
    statement = statement.on_conflict_do_update(
        index_elements=[DetectionUsageRow.token_id, DetectionUsageRow.day],
        set_={"tokens": DetectionUsageRow.tokens + tokens}).returning(DetectionUsageRow.tokens)
    total = int(session.execute(statement).scalar_one())
    if daily_tokens > 0 and total >= daily_tokens > total - tokens:
        row = session.get(DetectionUsageRow, (caller.token_id, day))
        row.exhausted_at = now
        append_event(session, EXHAUSTED_EVENT, caller.actor, caller.token_id,
                     {"day": day, "budget_tokens": daily_tokens, "used_tokens": total})
    return total


class UsageLedger:
    """One process's view of the budget: the database's totals (re-read at most every FLUSH_SECONDS while
    far from the budget, at every check near it) plus this process's unwritten charges."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: dict[str, tuple[Caller, int]] = {}
        self._stored: dict[str, tuple[int, float]] = {}  # token id -> (database total, when read)
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()

    def used(self, token_id: str, daily_tokens: int = 0, now: datetime | None = None) -> int:
        """Tokens charged today: the database's total plus this process's unwritten charges."""
        with self._lock:
            pending = self._pending.get(token_id, (None, 0))[1]
            stored, read_at = self._stored.get(token_id, (0, None))
        fresh = read_at is not None and time.monotonic() - read_at < FLUSH_SECONDS
        if not fresh or daily_tokens <= 0 or stored + pending >= daily_tokens - flush_tokens(daily_tokens):
            stored = used_today(self.store, token_id, now)
            with self._lock:
                self._stored[token_id] = (stored, time.monotonic())
        return stored + pending

    def retry_after(self, token_id: str, daily_tokens: int, now: datetime | None = None) -> int:
        """0 when ``token_id`` may detect now, else the seconds until its budget resets."""
        now = now or utc_now()
        if daily_tokens <= 0 or self.used(token_id, daily_tokens, now) < daily_tokens:
            return 0
        return seconds_to_next_day(now)

    def charge(self, caller: Caller, tokens: int, daily_tokens: int, now: datetime | None = None) -> None:
        """Record a charge; written now when near the budget (or the batch is due), else batched."""
        if caller.token_id is None:
            return
        batch = flush_tokens(daily_tokens)
        with self._lock:
            _, pending = self._pending.get(caller.token_id, (caller, 0))
            self._pending[caller.token_id] = (caller, pending + tokens)
            due = pending + tokens >= batch or time.monotonic() - self._last_flush >= FLUSH_SECONDS
            stored = self._stored.get(caller.token_id, (0, None))[0]
        near = daily_tokens > 0 and stored + pending + tokens >= daily_tokens - batch
        if due or near:
            self.flush(daily_tokens, now)

    def flush(self, daily_tokens: int, now: datetime | None = None) -> None:
        """Write every unwritten charge (one transaction per token)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._last_flush = time.monotonic()
        for caller, tokens in pending.values():
            total = charge(self.store, caller, tokens, daily_tokens, now)
            with self._lock:
                self._stored[caller.token_id] = (total, time.monotonic())
