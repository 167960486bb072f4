"""Public keys, no token: GET /v1/keys/<key_id>/public-half, the public half of a two-part key
(``watermark.public_key``; ``/public`` is its deprecated path, one release), GET /.well-known/jwks.json, the
keys that verify generation receipts, and
GET /v1/c2pa/trust-anchors, the roots C2PA manifests chain to.

A two-part key's public half exists to be published: anyone may fetch it and verify text offline
(``provmark detect --public-half FILE``). A one-part key has nothing public, and answers as an unknown id does.
No token, so the rate limit applies per client address (``Auth.limit_anonymous``).
"""

from __future__ import annotations

from flask import Blueprint, jsonify

from api.detector.schemas import PublicKeyDocument
from api.http import ApiError, ErrorResponse, deprecated
from api.provenance_keys import add_jwks_route, add_trust_anchors_route
from detector.two_part import published_document
from watermark.key_info import KEY_ID_RE, KeyNotFoundError, KeyStateError

NOT_PUBLISHED = "no two-part key with this id (only a two-part key has a public half)"


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("keys", __name__)

    @api.route(bp, "/v1/keys/<key_id>/public-half", methods=["GET"], summary="The public half of a two-part key",
               responses={200: PublicKeyDocument, 404: ErrorResponse, 429: ErrorResponse}, tags=["keys"])
    def public_half(key_id: str):
        return _public_half(services, key_id)

    @api.route(bp, "/v1/keys/<key_id>/public", methods=["GET"],
               summary="Deprecated for one release: GET /v1/keys/{key_id}/public-half",
               responses={200: PublicKeyDocument, 404: ErrorResponse, 429: ErrorResponse}, tags=["keys"])
    def public_key(key_id: str):
        deprecated("GET /v1/keys/<key_id>/public is deprecated; use /v1/keys/<key_id>/public-half")
        return _public_half(services, key_id)

    add_jwks_route(api, bp, services.public_keys.jwks, before=services.auth.limit_anonymous)
    add_trust_anchors_route(api, bp, services.public_keys.trust_anchors, before=services.auth.limit_anonymous)
    return bp


def _public_half(services, key_id: str):
    """The public half's document of a detection key that has one; 404 as for an unknown id otherwise."""
    services.auth.limit_anonymous()
    keyring = services.detector.keyring
    if not KEY_ID_RE.fullmatch(key_id):
        raise ApiError(404, "key_not_found", NOT_PUBLISHED)
    info = next((k for k in keyring.list() if k.key_id == key_id), None)
    try:
        if info is None or not info.used_for_detection:  # a retired key verifies nothing any more
            raise KeyNotFoundError(key_id)
        document = published_document(keyring, info, services.detector.vocab)
    except (KeyNotFoundError, KeyStateError):
        raise ApiError(404, "key_not_found", NOT_PUBLISHED) from None
    return jsonify(PublicKeyDocument.model_validate(document.to_dict()).model_dump())

