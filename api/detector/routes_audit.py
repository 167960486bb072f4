"""GET /v1/audit (events in chain order, paged) and GET /v1/audit/verify; scope ``audit``.

A token without ``explain`` reads ``detection`` events without the verdict, the exact z, the key id and the row
digest, and no event's chain hashes: a caller who chose the text knows every other input of those digests, so each
would let it test guesses of the exact green count (the next event's ``prev_hash`` is this one's hash, and
``/v1/audit/verify``'s ``head_hash`` the newest event's). The chain is still checked, by the server
(``/v1/audit/verify``, without ``head_hash``).

``/v1/audit/verify`` walks the whole database (every event, every verdict and receipt row), so each token may run
it VERIFY_BURST times at once and then once every 60 / VERIFY_PER_MINUTE seconds (429 with Retry-After, saying
so), and a worker runs one check at a time (a second at the same moment: 429, Retry-After 5). ``provmark audit
verify`` on a host that reaches the database runs the same check without a limit.
"""

from __future__ import annotations

import math
import threading

from flask import Blueprint, g, jsonify

from api.detector.routes_verdicts import reads_exact
from api.detector.schemas import AuditList, AuditQuery, AuditReportBody
from api.http import ApiError, parse_query
from api.limits import RateLimiter
from db.audit import list_events, verify
from provenance.identity import IdentityError

# what a ``detection`` event carries that a reader without ``explain`` does not see (module docstring; the key id
# is the best-scoring key's even for a negative verdict, which the detect-scope view does not name)
EXACT_DETAILS = ("verdict", "z", "row_sha256", "key_id")
VERIFY_BURST = 3  # whole-database checks a token may ask for at once
VERIFY_PER_MINUTE = 0.2  # then one every 5 minutes
BUSY_RETRY_S = 5


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("audit", __name__)
    store = services.store
    checks, running = RateLimiter(VERIFY_PER_MINUTE, VERIFY_BURST), threading.Lock()

    @api.route(bp, "/v1/audit", methods=["GET"], summary="Audit events in chain order",
               query=AuditQuery, responses={200: AuditList}, scope="audit", tags=["audit"])
    @services.auth.require("audit")
    def list_audit_events():
        query: AuditQuery = parse_query(AuditQuery)
        events = list_events(store, after_seq=query.after_seq, limit=query.limit, kind=query.kind,
                             subject_id=query.subject_id)
        # A full page may have more behind it; a short page is the end of the chain (for now).
        next_after = events[-1].seq if len(events) == query.limit else None
        exact = reads_exact()
        return jsonify({"items": [e.to_dict() if exact else _coarse(e.to_dict()) for e in events],
                        "next_after_seq": next_after})

    @api.route(bp, "/v1/audit/verify", methods=["GET"], summary="Check the whole audit hash chain",
               responses={200: AuditReportBody}, scope="audit", tags=["audit"])
    @services.auth.require("audit")
    def verify_audit_chain():
        """The whole chain and the rows it covers, checked from the first event (module docstring: the limits)."""
        wait = checks.take(g.token.token_id)
        if wait > 0:
            raise ApiError(429, "rate_limited",
                           f"the audit check walks the whole database: {VERIFY_BURST} checks at once, then one every "
                           f"{round(60 / VERIFY_PER_MINUTE)} s per token (provmark audit verify has no limit)",
                           headers={"Retry-After": str(max(1, math.ceil(wait)))})
        if not running.acquire(blocking=False):
            raise ApiError(429, "rate_limited", "an audit check is running in this worker; ask again shortly",
                           headers={"Retry-After": str(BUSY_RETRY_S)})
        try:
            report = verify(store, log_key=_log_key(services)).to_dict()
        finally:
            running.release()
        if not reads_exact():
            report["head_hash"] = None  # the newest event's hash: a detection's would test guesses of its G
        return jsonify(report)

    return bp


def _coarse(event: dict) -> dict:
    """An event as a token without ``explain`` reads it (module docstring)."""
    details = event["details"]
    if event["kind"] == "detection" and isinstance(details, dict):
        details = {name: value for name, value in details.items() if name not in EXACT_DETAILS}
    return {**event, "details": details, "prev_hash": None, "hash": None}


def _log_key(services):
    """The deployment's log key, which checks the kept heads (None before there is one)."""
    try:
        identity = services.public_keys.cache.get()
    except IdentityError:
        raise ApiError(503, "identity_unreadable", "the deployment's log key cannot be read as it was signed; "
                                                   "the operator is told why (provmark identity show)") from None
    return identity.log_key() if identity is not None else None
