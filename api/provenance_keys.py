"""What both services publish for verifiers, without a token (anonymous callers are rate-limited per address
where a service limits them):

    GET /.well-known/jwks.json    the JWKS of receipt keys (also ``provmark receipts jwks``): the key in use and
                                  every key it replaced (``retired_at`` on those), so a receipt verifies with any
                                  JOSE library from this one document, before and after a rotation
    GET /v1/c2pa/trust-anchors    the PEM roots C2PA manifests chain to (the development CA's root by default)
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Response, jsonify
from pydantic import BaseModel, ConfigDict, Field

from db.receipts import ReceiptSigner

JWKS_PATH = "/.well-known/jwks.json"
JWKS_MAX_AGE_S = 300  # a rotation reaches caches within minutes; retired keys stay listed anyway


class Jwk(BaseModel):
    """One public Ed25519 key (RFC 8037): ``kid`` is its RFC 7638 thumbprint."""

    model_config = ConfigDict(extra="allow")
    kty: str = Field(examples=["OKP"])
    crv: str = Field(examples=["Ed25519"])
    x: str
    kid: str
    alg: str = Field(examples=["Ed25519"])
    use: str = Field(examples=["sig"])
    retired_at: str | None = Field(default=None, description="set on keys that no longer sign, which still verify")


class Jwks(BaseModel):
    """The keys that verify this issuer's receipts: the current one first, then every retired one."""

    keys: list[Jwk]


def jwks_document(signer: ReceiptSigner) -> dict:
    return {"keys": signer.jwks_keys()}


def add_jwks_route(api, target, signer: Callable[[], ReceiptSigner], before: Callable[[], None] | None = None) -> None:
    """``GET /.well-known/jwks.json`` on ``target`` (a Flask app or blueprint), documented in ``api``."""

    @api.route(target, JWKS_PATH, methods=["GET"], summary="The JWKS that verifies this issuer's receipts",
               responses={200: Jwks}, tags=["keys"])
    def jwks() -> Response:
        if before is not None:
            before()
        response = jsonify(jwks_document(signer()))  # application/json, as JOSE libraries' fetchers expect
        response.headers["Cache-Control"] = f"public, max-age={JWKS_MAX_AGE_S}"
        return response


TRUST_ANCHORS_PATH = "/v1/c2pa/trust-anchors"
PEM_MEDIA_TYPE = "application/x-pem-file"


def add_trust_anchors_route(api, target, anchors: Callable[[], str], before: Callable[[], None] | None = None) -> None:
    """``GET /v1/c2pa/trust-anchors`` on ``target``: the PEM roots to give c2pa's Reader (``trust_anchors``)."""

    @api.route(target, TRUST_ANCHORS_PATH, methods=["GET"], summary="The roots C2PA manifests chain to (PEM)",
               responses={200: (PEM_MEDIA_TYPE, "PEM certificates")}, tags=["keys"])
    def c2pa_trust_anchors() -> Response:
        if before is not None:
            before()
        return Response(anchors(), mimetype=PEM_MEDIA_TYPE,
                        headers={"Cache-Control": f"public, max-age={JWKS_MAX_AGE_S}"})
