"""The transparency log over the audit events (``db.transparency``; formats in docs/transparency-log.md).

    GET /v1/log/head                        no token: the newest signed tree head (signed by the generation
                                            service every few seconds while the log grows, or `provmark log sign`)
    GET /v1/log/public-key                  no token: the deployment's log key as JWK (and JWKS), PEM and note
                                            verifier key (the same from every replica)
    GET /v1/log/proof/inclusion?id=&tree_size=      scopes ``audit`` and ``explain``: an event's inclusion bundle
    GET /v1/log/proof/consistency?first=&second=    no token: a consistency bundle between two kept heads

Inclusion proofs need ``explain`` as well as ``audit`` for the reason /v1/audit hides event hashes from
``audit`` alone (routes_audit): a bundle carries a detection event's chain hash and row digest in its entry,
and its path starts with a neighbouring event's leaf hash, each of which would let a caller who chose the
text test guesses of the exact green count.

A consistency proof needs no token, so that anyone can run a witness (``provmark log witness``): every hash
it carries is a Merkle node over whole log entries, and each entry holds its event's random event id (a
UUID4: 122 random bits) and its chain hash (shown only with ``explain``), so no hash in it can be recomputed
from a guess of a detection's details. An inclusion proof, which carries the entry itself, can.
"""

from __future__ import annotations

import logging

from flask import Blueprint, jsonify

from api.detector.routes_verdicts import reads_exact
from api.detector.schemas import (
    ConsistencyProofBody,
    ConsistencyQuery,
    InclusionProofBody,
    InclusionQuery,
    LogPublicKeyBody,
    TreeHeadBody,
)
from api.http import ApiError, ErrorResponse, parse_query
from db.transparency import (
    LogError,
    LogNotFound,
    consistency_proof,
    inclusion_proof,
    newest_head,
)
from provenance.identity import IdentityError, IdentityMissing
from provenance.log_signer import public_document

PROOF_ERRORS = {404: ErrorResponse, 409: ErrorResponse}
log = logging.getLogger(__name__)


def _log_key(services):
    """The deployment's log public key (the detector holds no private key); 404 before the identity exists."""
    try:
        return services.public_keys.cache.require().log_key()
    except IdentityMissing:
        raise ApiError(404, "not_found", "this deployment has no log key yet: its identity is made by "
                                         "`provmark identity init`") from None
    except IdentityError:
        log.error("the deployment's log key cannot be served", exc_info=True)
        raise ApiError(503, "identity_unreadable", "the log key cannot be read as the deployment signed it; the "
                                                   "operator is told why") from None


def _answering(action):
    """``action()``, with the log's refusals as JSON 4xx."""
    try:
        return action()
    except LogNotFound as error:
        raise ApiError(404, "not_found", str(error)) from None
    except LogError as error:
        raise ApiError(409, "log_conflict", str(error)) from None


def _require_exact() -> None:
    if not reads_exact():
        raise ApiError(403, "forbidden", "proofs carry exact event hashes: they need the explain scope as well as "
                                         "audit (see /v1/audit)")


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("log", __name__)
    store = services.store

    @api.route(bp, "/v1/log/head", methods=["GET"], summary="The newest signed tree head of the transparency log",
               responses={200: TreeHeadBody, 404: ErrorResponse, 429: ErrorResponse}, tags=["log"])
    def log_head():
        services.auth.limit_anonymous()
        head = _answering(lambda: newest_head(store))
        return jsonify(head.to_dict())

    @api.route(bp, "/v1/log/public-key", methods=["GET"], summary="The transparency log's public key",
               responses={200: LogPublicKeyBody, 404: ErrorResponse, 429: ErrorResponse}, tags=["log"])
    def log_public_key():
        services.auth.limit_anonymous()
        return jsonify(public_document(_log_key(services)))

    @api.route(bp, "/v1/log/proof/inclusion", methods=["GET"], summary="An audit event's inclusion proof",
               query=InclusionQuery, responses={200: InclusionProofBody, **PROOF_ERRORS}, scope=("audit", "explain"),
               tags=["log"])
    @services.auth.require("audit")
    def log_inclusion_proof():
        _require_exact()
        query: InclusionQuery = parse_query(InclusionQuery)
        return jsonify(_answering(lambda: inclusion_proof(store, None, query.id, query.tree_size)))

    @api.route(bp, "/v1/log/proof/consistency", methods=["GET"], summary="A consistency proof between two kept heads",
               query=ConsistencyQuery, responses={200: ConsistencyProofBody, 429: ErrorResponse, **PROOF_ERRORS},
               tags=["log"])
    def log_consistency_proof():
        """No token (module docstring): its hashes are nodes over whole entries, each holding a random event id,
        so unlike an inclusion proof (which carries the entry) it cannot test guesses of a detection's details."""
        services.auth.limit_anonymous()
        query: ConsistencyQuery = parse_query(ConsistencyQuery)
        if query.first > query.second:  # each size is valid alone; no proof leads from a larger tree to a smaller one
            raise ApiError(404, "not_found", f"no consistency proof leads from size {query.first} down to size "
                                             f"{query.second}: first must not exceed second")
        return jsonify(_answering(lambda: consistency_proof(store, query.first, query.second)))

    return bp
