"""The deployment's provenance identity as a service holds it (``db.identity``), and what both services publish
for verifiers, without a token (anonymous callers are rate-limited per address):

    GET /.well-known/jwks.json    the JWKS of receipt keys (also ``provmark receipts jwks``): the key in use and
                                  every key it replaced (``retired_at`` on those), so a receipt verifies with any
                                  JOSE library from this one document, before and after a rotation
    GET /v1/c2pa/trust-anchors    the PEM roots C2PA manifests chain to (the development CA's root by default)

Every replica reads them from the shared database, so every replica publishes the same documents. Only a
signing service (``SigningKeys``: the generation service, ``provmark log sign``) opens private keys; the
detector holds ``PublicKeys`` and never creates or opens one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from flask import Response, jsonify
from pydantic import BaseModel, ConfigDict, Field

from api.http import ApiError, ErrorResponse
from api.settings import Settings
from db.identity import (
    IdentityCache,
    current_private,
    ensure_identity,
    replace_certificate,
    seal_of,
)
from db.receipts import ReceiptSigner
from db.store import Store
from provenance.c2pa_credential import (
    C2paCredential,
    C2paCredentialError,
    DevelopmentCa,
    configured_trust_anchors,
    load_c2pa_credential,
    new_development_ca,
    renewed_signer,
)
from provenance.identity import (
    C2PA_ROOT,
    C2PA_SIGNER,
    LOG,
    IdentityError,
    IdentityMissing,
    IdentitySeal,
    PublicIdentity,
)
from provenance.log_signer import LogSigner

log = logging.getLogger(__name__)

JWKS_PATH = "/.well-known/jwks.json"
JWKS_MAX_AGE_S = 60  # a rotation reaches HTTP caches within a minute; retired keys stay listed anyway


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


def service_identity(settings: Settings, store: Store, seal: IdentitySeal, *, create: bool,
                     actor: str) -> PublicIdentity:
    """The deployment's identity as this replica must serve it: made when ``create`` and there is none, and
    checked against the replica's home and its pinned id (PROVMARK_IDENTITY); IdentityError otherwise."""
    identity = ensure_identity(store, seal, settings.home, new_development_ca, create=create, actor=actor)
    if settings.identity is not None and identity.deployment_id != settings.identity:
        raise IdentityError(f"the database holds deployment {identity.deployment_id}, not {settings.identity} "
                            "(PROVMARK_IDENTITY): this replica is pointed at another deployment's database")
    return identity


def development_ca(store: Store, seal: IdentitySeal, now: datetime | None = None) -> DevelopmentCa:
    """The deployment's development CA with its keys opened; its signing certificate re-issued (and stored)
    when it nears its end (``now``: the time to judge that by)."""
    root_key, root = current_private(store, seal, C2PA_ROOT)
    signer_key, signer = current_private(store, seal, C2PA_SIGNER)
    ca = DevelopmentCa(root.certificate or "", root_key, signer_key, signer.certificate or "")
    renewed = renewed_signer(ca, now or datetime.now(UTC))
    if renewed is not None:
        replace_certificate(store, seal, signer, renewed)
        ca = DevelopmentCa(ca.root_pem, root_key, signer_key, renewed)
    return ca


class SigningKeys:
    """The private keys of a signing service: receipts, the log's heads, C2PA manifests (a production chain
    when one is configured, else the deployment's development CA)."""

    __slots__ = ("c2pa", "identity", "log", "receipts", "seal")

    def __init__(self, settings: Settings, store: Store, *, create: bool, actor: str):
        self.seal = seal_of(settings.home, create=create)
        self.identity = service_identity(settings, store, self.seal, create=create, actor=actor)
        self.receipts = ReceiptSigner(store, self.seal)
        self.log = LogSigner(private_key=current_private(store, self.seal, LOG)[0])
        c2pa_settings = settings.c2pa()
        development = None if c2pa_settings.cert_chain is not None else development_ca(store, self.seal)
        self.c2pa: C2paCredential = load_c2pa_credential(c2pa_settings, development)


class PublicKeys:
    """What a verifying service publishes, read from the shared database (re-read every few seconds, so a
    rotation reaches it within ``db.identity.REFRESH_S``); opens no private key, creates nothing."""

    __slots__ = ("_anchors", "cache")

    def __init__(self, settings: Settings, store: Store):
        self.cache = IdentityCache(store, seal_of(settings.home, create=False))
        try:
            self._anchors = configured_trust_anchors(settings.c2pa())
        except C2paCredentialError as error:
            raise ValueError(str(error)) from None

    def jwks(self) -> dict:
        identity = self.cache.get()
        return identity.jwks() if identity is not None else {"keys": []}

    def trust_anchors(self) -> str:
        """PROVMARK_C2PA_TRUST_ANCHORS when set, else the deployment's development root; IdentityError when
        there is neither."""
        return self._anchors if self._anchors is not None else self.cache.require().trust_anchor_pem()


def add_jwks_route(api, target, document_of: Callable[[], dict], before: Callable[[], None] | None = None) -> None:
    """``GET /.well-known/jwks.json`` on ``target`` (a Flask app or blueprint), documented in ``api``."""

    @api.route(target, JWKS_PATH, methods=["GET"], summary="The JWKS that verifies this issuer's receipts",
               responses={200: Jwks}, tags=["keys"])
    def jwks() -> Response:
        if before is not None:
            before()
        try:
            document = document_of()
        except IdentityError:  # the operator's log has the details; a forged key is never served
            log.error("the deployment's receipt keys cannot be served", exc_info=True)
            raise ApiError(503, "identity_unreadable", "the receipt keys cannot be read as the deployment "
                                                       "signed them; the operator is told why") from None
        response = jsonify(document)  # application/json, as JOSE libraries' fetchers expect
        response.headers["Cache-Control"] = f"public, max-age={JWKS_MAX_AGE_S}"
        return response


TRUST_ANCHORS_PATH = "/v1/c2pa/trust-anchors"
PEM_MEDIA_TYPE = "application/x-pem-file"


def add_trust_anchors_route(api, target, anchors: Callable[[], str], before: Callable[[], None] | None = None) -> None:
    """``GET /v1/c2pa/trust-anchors`` on ``target``: the PEM roots to give c2pa's Reader (``trust_anchors``)."""

    @api.route(target, TRUST_ANCHORS_PATH, methods=["GET"], summary="The roots C2PA manifests chain to (PEM)",
               responses={200: (PEM_MEDIA_TYPE, "PEM certificates"), 404: ErrorResponse}, tags=["keys"])
    def c2pa_trust_anchors() -> Response:
        if before is not None:
            before()
        try:
            pem = anchors()
        except IdentityMissing:
            raise ApiError(404, "not_found", "this deployment has no C2PA trust anchor yet: its identity is made "
                                             "by `provmark identity init`") from None
        except IdentityError:
            log.error("the deployment's C2PA trust anchors cannot be served", exc_info=True)
            raise ApiError(503, "identity_unreadable", "the C2PA trust anchors cannot be read as the deployment "
                                                       "signed them; the operator is told why") from None
        return Response(pem, mimetype=PEM_MEDIA_TYPE,
                        headers={"Cache-Control": f"public, max-age={JWKS_MAX_AGE_S}"})

