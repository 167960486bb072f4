"""What both services do against a caller who tries things: rate limits per token and per address, failed
authentications throttled, and the security headers of every answer.

* ``RateLimiter``: a token bucket per key (an API token's id, or ``address:`` and the client address for routes
  without a token). Its table forgets a key once its bucket has refilled (a full bucket and no entry are the same
  thing), checked after every PRUNE_EVERY new keys, and holds at most MAX_KEYS keys whatever the traffic: past
  that the keys least recently seen go first.
* ``AuthFailures``: bad bearer tokens per client address and per token prefix (the first PREFIX_CHARS characters
  of what was presented, kept as a short SHA-256, never the characters). AUTH_FAILURE_BURST failures in a row,
  then one more each 60 / AUTH_FAILURES_PER_MINUTE seconds. Past that, a token with that prefix is answered 429
  with Retry-After before it is looked up, and an unknown token from that address 429 instead of 401; a live
  token from the address still passes (behind a reverse proxy that does not pass client addresses on, every
  client has the proxy's address, and one client's bad tokens must not lock the others out). ``api.http.Auth``
  appends one ``token.throttled`` audit event when a key is throttled (at most one per key each
  EVENT_INTERVAL_S).
* ``install_security_headers``: ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer`` on every
  answer, and PAGE_CSP on HTML (the detector's paste page, both services' ``/docs``).

All of it is per process: with N workers a service allows N times these rates.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from flask import Flask, Response

MAX_KEYS = 100_000  # keys a limiter's table holds at most (an address or token each: tens of bytes)
PRUNE_EVERY = 1024  # new keys between two sweeps of refilled buckets (amortised: a sweep costs the table's size)
AUTH_FAILURE_BURST = 5  # bad tokens in a row from one address (or with one prefix) before 429
AUTH_FAILURES_PER_MINUTE = 6.0  # then one more every 10 s
PREFIX_CHARS = 12  # "pmk_" and 8 characters of the presented token, hashed
EVENT_INTERVAL_S = 600.0  # one token.throttled audit event per address or prefix in this time, at most


class RateLimiter:
    """A token bucket per key: ``per_minute`` sustained, ``burst`` at once (module docstring). ``clock``: seconds,
    monotonic (tests pass their own)."""

    def __init__(self, per_minute: float, burst: int | None = None, *, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(burst if burst is not None else max(1, int(per_minute)))
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when), least recently seen first
        self._next_sweep = PRUNE_EVERY
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float:
        """0.0 if allowed now (one request counted), else the seconds until one request is allowed."""
        return self._take(key, consume=True)

    def wait(self, key: str) -> float:
        """The seconds until ``take`` would allow ``key`` (0.0: now), counting nothing."""
        return self._take(key, consume=False)

    def _take(self, key: str, consume: bool) -> float:
        now = self.clock()
        with self._lock:
            tokens, stamp = self._buckets.pop(key, (self.capacity, now))  # re-inserted last: most recently seen
            tokens = min(self.capacity, tokens + (now - stamp) * self.rate)
            allowed = tokens >= 1.0
            if consume and allowed:
                tokens -= 1.0
            if tokens < self.capacity:  # a full bucket needs no entry
                self._buckets[key] = (tokens, now)
            if len(self._buckets) >= self._next_sweep:
                self._sweep(now)
        if allowed:
            return 0.0
        return (1.0 - tokens) / self.rate if self.rate > 0 else 60.0

    def _sweep(self, now: float) -> None:
        """Forget the buckets that have refilled; past ``max_keys``, the least recently seen (lock held)."""
        if self.rate > 0:
            refilled = [key for key, (tokens, stamp) in self._buckets.items()
                        if tokens + (now - stamp) * self.rate >= self.capacity]
            for key in refilled:
                del self._buckets[key]
        excess = len(self._buckets) - self.max_keys
        if excess > 0:
            for key in list(self._buckets)[:excess]:
                del self._buckets[key]
        self._next_sweep = min(self.max_keys, len(self._buckets)) + PRUNE_EVERY


def prefix_key(presented: str) -> str:
    """A short name for the first PREFIX_CHARS characters of a presented token: 16 hex digits of their SHA-256."""
    return hashlib.sha256(presented[:PREFIX_CHARS].encode("utf-8", "surrogatepass")).hexdigest()[:16]


class AuthFailures:
    """Failed authentications per client address and per token prefix (module docstring)."""

    def __init__(self, burst: int = AUTH_FAILURE_BURST, per_minute: float = AUTH_FAILURES_PER_MINUTE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limiter = RateLimiter(per_minute, burst, clock=clock)
        self.clock = clock
        self._events: dict[str, float] = {}  # key -> when its last audit event was written
        self._lock = threading.Lock()

    @staticmethod
    def keys(address: str, presented: str) -> tuple[str, str]:
        return "address:" + address, "prefix:" + prefix_key(presented)

    def prefix_wait(self, presented: str) -> float:
        """Seconds before a token with this prefix is looked up again (0.0: now)."""
        return self.limiter.wait(self.keys("", presented)[1])

    def address_wait(self, address: str) -> float:
        """Seconds before a failed token from ``address`` is answered 401 again rather than 429 (0.0: now)."""
        return self.limiter.wait(self.keys(address, "")[0])

    def failed(self, address: str, presented: str) -> list[str]:
        """Count one failure against the address and the prefix; the keys that now need an audit event (those
        throttled from now on, each at most once per EVENT_INTERVAL_S)."""
        now = self.clock()
        due = []
        for key in self.keys(address, presented):
            self.limiter.take(key)
            if self.limiter.wait(key) > 0:
                with self._lock:
                    if now - self._events.get(key, -EVENT_INTERVAL_S) >= EVENT_INTERVAL_S:
                        self._events[key] = now
                        due.append(key)
                    if len(self._events) > self.limiter.max_keys:  # bounded like the buckets
                        stale = [k for k, t in self._events.items() if now - t >= EVENT_INTERVAL_S]
                        for k in stale or list(self._events)[: len(self._events) // 2]:
                            del self._events[k]
        return due


# The pages load only their own script and style sheet and talk only to their own service.
PAGE_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
            "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def security_headers(response: Response) -> Response:
    """nosniff and no referrer on every answer; the page CSP on HTML."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if response.mimetype == "text/html":
        response.headers.setdefault("Content-Security-Policy", PAGE_CSP)
    return response


def install_security_headers(app: Flask) -> None:
    app.after_request(security_headers)
