"""Generation receipts: Ed25519-signed statements of what was generated, verifiable offline.

A receipt is a JSON object: the ``SIGNED_FIELDS`` and ``jws``, a compact JWS (``provenance.jws``: alg
Ed25519, ``kid``, typ ``provmark-receipt+jwt``) whose claims are those fields plus ``iss``, ``iat``,
``jti`` (the receipt id) and the ids the other provenance layers use (``ReceiptLinks``: the watermark
spec, the C2PA manifest id, the detector's address). Any JOSE library checks the JWS against the
issuer's JWKS (``/.well-known/jwks.json``), which lists the current key and every retired one.

The legacy form stays for receipts issued before the JWS: ``signature`` is base64 Ed25519 over the
canonical JSON of exactly ``SIGNED_FIELDS`` (sorted keys, no whitespace, UTF-8), ``signer_id`` names
the key (16 hex digits of SHA-256 of its raw bytes), checked by ``verify_receipt``; new receipts carry
it too, for one release.

The private key is the deployment's current receipt key (``db.identity``: sealed under the master key in
the shared database), so every generation replica signs with it and every replica's JWKS lists it. A
key's ``retired_at`` in the JWKS is enforced: what it signs after its retirement does not verify.
Receipts are stored with a ``generation`` audit event whose ``subject_sha256`` is the SHA-256 of the
JWS, so the transparency log's entry names the exact receipt; ``find_receipt_by_text_sha256`` links a
detected text to the receipt of the exact same text (provenance by exact match).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from sqlalchemy import select

from db.audit import append_event, canonical_json, lock_chain
from db.audit_rows import row_digest
from db.identity import current_kid, current_private, load_identity, rotate_receipt_key
from db.manifests import ManifestRecord, add_manifest
from db.rows import ReceiptRow, iso_utc, new_id, utc_now
from db.store import Store
from provenance.identity import RECEIPT, IdentityError, IdentitySeal, parse_time
from provenance.jws import JwsError, ed25519_of, key_id, sign_compact, verify_compact
from provenance.sealed_key import raw_public, signer_id
from watermark.key_info import validate_key_id

ALGORITHM = "Ed25519"
SIGNED_FIELDS = (
    "text_sha256", "token_count", "model_id", "spec_fingerprint", "key_id", "created_at", "receipt_id",
)
DEFAULT_ISSUER = "http://127.0.0.1:8000"  # the generation service of `make serve` (PROVMARK_ISSUER)
ROTATION_RETRIES = 3  # a receipt signed during a rotation is signed again with the new key
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


class ReceiptError(Exception):
    """A bad receipt request or an unusable signing-key file. Never contains key material."""


class ReceiptSigner:
    """Signs receipts with the deployment's current receipt key (``db.identity``); after a rotation anywhere
    it loads the new key before its next receipt is stored (``issue_receipt``)."""

    __slots__ = ("_key", "_lock", "seal", "store")

    def __init__(self, store: Store, seal: IdentitySeal):
        self.store, self.seal = store, seal
        self._lock = threading.Lock()
        self._key = self._load()

    def _load(self) -> Ed25519PrivateKey:
        try:
            return current_private(self.store, self.seal, RECEIPT)[0]
        except IdentityError as error:
            raise ReceiptError(str(error)) from None

    def refresh(self) -> None:
        """Load the deployment's current key (after another process rotated it)."""
        with self._lock:
            self._key = self._load()

    def __repr__(self) -> str:
        return f"ReceiptSigner(signer_id={self.signer_id!r})"

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self._key.public_key()

    @property
    def signer_id(self) -> str:
        return signer_id(self.public_key)

    @property
    def kid(self) -> str:
        """The current key's ``kid`` in the JWKS (its RFC 7638 thumbprint)."""
        return key_id(self.public_key)

    def public_key_pem(self) -> str:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def public_key_b64(self) -> str:
        return base64.b64encode(raw_public(self.public_key)).decode()

    def sign(self, payload: dict) -> str:
        """Base64 Ed25519 signature over the canonical JSON of ``payload`` (the legacy receipt form)."""
        return base64.b64encode(self._key.sign(canonical_json(payload))).decode()

    def sign_jws(self, claims: dict) -> str:
        """A compact JWS of ``claims`` (``provenance.jws``: alg Ed25519, kid, typ provmark-receipt+jwt)."""
        return sign_compact(self._key, claims)

    def jwks_keys(self) -> list[dict]:
        """The current key's public JWK, then every retired one (each with ``retired_at``)."""
        identity = load_identity(self.store, self.seal)
        return identity.jwks()["keys"] if identity is not None else []

    def rotate(self, store: Store, actor: str) -> dict:
        """A new signing key for the deployment; the old one stays in the JWKS, retired now. Logged as a
        ``key.receipt_rotate`` event."""
        try:
            old, new = rotate_receipt_key(store, self.seal, actor)
        except IdentityError as error:
            raise ReceiptError(str(error)) from None
        self.refresh()
        return {"retired": old, "current": new}


@dataclass(slots=True, frozen=True)
class ReceiptLinks:
    """What a receipt's JWS says beyond its fields: who issued it, and the ids the other provenance layers
    use (the watermark's spec, the C2PA manifest of the same text, where the text is checked)."""

    issuer: str = DEFAULT_ISSUER
    detector: str | None = None
    spec: str | None = None
    c2pa_manifest_id: str | None = None

    def claims(self) -> dict:
        return {"iss": self.issuer, "detector": self.detector, "spec": self.spec,
                "c2pa_manifest_id": self.c2pa_manifest_id}


def sign_receipt(signer: ReceiptSigner, *, text_sha256: str, token_count: int, model_id: str,
                 spec_fingerprint: str, key_id: str, created_at: str | None = None,
                 receipt_id: str | None = None, links: ReceiptLinks | None = None) -> dict:
    """A signed receipt (a JSON-ready dict): the fields, their JWS (``jws``), and the legacy detached
    signature over their canonical JSON; fields are validated first, naming the bad one."""
    payload = {
        "text_sha256": text_sha256,
        "token_count": token_count,
        "model_id": model_id,
        "spec_fingerprint": spec_fingerprint,
        "key_id": key_id,
        "created_at": created_at or iso_utc(utc_now()),
        "receipt_id": receipt_id or new_id(),
    }
    _validate(payload)
    links = links or ReceiptLinks()
    _validate_links(links)
    claims = {**payload, **links.claims(), "jti": payload["receipt_id"], "iat": _epoch(payload["created_at"])}
    return {**payload, "signature": signer.sign(payload), "signer_id": signer.signer_id, "algorithm": ALGORITHM,
            "jws": signer.sign_jws(claims)}


def verify_receipt_jws(token: str, jwks: dict) -> dict:
    """The claims of a JWS receipt that verifies with its ``kid``'s key in ``jwks``; else ReceiptError
    naming the failed check."""
    try:
        verified = verify_compact(token, jwks)
    except JwsError as error:
        raise ReceiptError(str(error)) from None
    try:
        _validate(verified.claims)
    except ReceiptError as error:
        raise ReceiptError(f"the receipt's claims are not a provmark receipt: {error}") from None
    kid = verified.header.get("kid")
    _check_not_retired(next(key for key in jwks["keys"] if key.get("kid") == kid), verified.claims["created_at"])
    return verified.claims


def _check_not_retired(jwk: dict, created_at: str) -> None:
    """ReceiptError when the key was retired (``retired_at`` in the JWKS) before ``created_at``: what a key
    signs after its retirement (a leaked key, say) does not verify."""
    retired_at = jwk.get("retired_at")
    if retired_at is None:
        return
    try:
        after = parse_time(created_at) > parse_time(retired_at)
    except (TypeError, ValueError):
        after = True  # an unreadable retirement time counts as already past
    if after:
        raise ReceiptError(f"the receipt is dated {created_at}, after its key {jwk.get('kid')!r} was retired at "
                           f"{retired_at}: a retired key's later signatures are refused")


def legacy_key_in(jwks: dict, signer: str) -> tuple[Ed25519PublicKey, dict]:
    """The key of ``jwks`` whose signer id is ``signer`` and its JWK: how a legacy receipt (no JWS) finds
    its key."""
    for jwk in jwks.get("keys", []) if isinstance(jwks, dict) else []:
        try:
            public = ed25519_of(jwk)
        except JwsError:
            continue
        if signer_id(public) == signer:
            return public, jwk
    raise ReceiptError(f"no key in the JWKS has the legacy receipt's signer id {signer!r}")


def verify_legacy_receipt(receipt: dict, jwks: dict) -> dict:
    """The seven signed fields of a legacy receipt (no JWS) whose signature verifies with the key of ``jwks``
    its ``signer_id`` names, that was not retired before it was made; else ReceiptError. Nothing else the
    object holds is returned: nothing else is signed."""
    public, jwk = legacy_key_in(jwks, str(receipt.get("signer_id")))
    if not verify_receipt(receipt, public):
        raise ReceiptError("the legacy signature does not verify with the key its signer_id names")
    _check_not_retired(jwk, receipt["created_at"])
    return {name: receipt[name] for name in SIGNED_FIELDS}


def verify_receipt(receipt: dict, public_key) -> bool:
    """True only if ``receipt``'s signed fields and signature are exactly as signed by ``public_key``.

    ``public_key``: an Ed25519PublicKey, PEM text/bytes, raw base64 text or 32 raw bytes. Offline.
    """
    try:
        key = load_public_key(public_key)
        payload = {name: receipt[name] for name in SIGNED_FIELDS}
        signature = base64.b64decode(receipt["signature"], validate=True)
        key.verify(signature, canonical_json(payload))
    except (InvalidSignature, KeyError, TypeError, ValueError, binascii.Error):
        return False
    return True


def load_public_key(value) -> Ed25519PublicKey:
    """An Ed25519 public key from a key object, PEM, raw base64 or 32 raw bytes."""
    if isinstance(value, Ed25519PublicKey):
        return value
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, bytes) and value.lstrip().startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(value)
        if not isinstance(key, Ed25519PublicKey):
            raise ValueError("the PEM public key is not an Ed25519 key")
        return key
    if isinstance(value, bytes) and len(value) != 32:
        value = base64.b64decode(value, validate=True)
    return Ed25519PublicKey.from_public_bytes(value)


class KeyRotated(ReceiptError):
    """The receipt was signed with a key that is no longer the deployment's current one."""


def store_receipt(store: Store, receipt: dict, actor: str, manifest: ManifestRecord | None = None,
                  signed_with: str | None = None) -> None:
    """Store a signed receipt and its ``generation`` audit event, and the C2PA manifest of the same text
    with its ``manifest`` event when there is one, in one transaction. ``signed_with``: the ``kid`` that
    signed it, checked to still be current under the lock a rotation takes (else KeyRotated, nothing
    stored)."""
    _validate(receipt)
    row = ReceiptRow(**{name: receipt[name] for name in SIGNED_FIELDS}, signer_id=receipt["signer_id"],
                     signature=receipt["signature"], jws=receipt.get("jws"), stored_at=utc_now())
    details = {name: receipt[name] for name in ("model_id", "key_id", "token_count", "spec_fingerprint")}
    details["row_sha256"] = row_digest(row)
    if row.jws is not None:  # what an outsider holding the receipt finds in the transparency log's entry
        details["subject_sha256"] = hashlib.sha256(row.jws.encode("ascii")).hexdigest()
    with store.write() as session:
        if signed_with is not None:
            lock_chain(session)  # rotate_receipt_key swaps keys under this lock
            if current_kid(session, RECEIPT) != signed_with:
                raise KeyRotated("the receipt key was rotated while this receipt was signed")
        session.add(row)
        session.flush()
        append_event(session, "generation", actor, receipt["receipt_id"], details)
        if manifest is not None:
            add_manifest(session, manifest, actor)


def issue_receipt(store: Store, signer: ReceiptSigner, actor: str, manifest: ManifestRecord | None = None,
                  **fields) -> dict:
    """Sign (``sign_receipt`` fields) and store in one step, with the text's manifest if any; returns the
    receipt."""
    for _ in range(ROTATION_RETRIES):
        kid = signer.kid
        receipt = sign_receipt(signer, **fields)
        try:
            store_receipt(store, receipt, actor, manifest, signed_with=kid)
            return receipt
        except KeyRotated:
            signer.refresh()
    raise ReceiptError("the receipt key kept changing while this receipt was signed; try again")


def get_receipt(store: Store, receipt_id: str) -> dict | None:
    with store.read() as session:
        row = session.get(ReceiptRow, receipt_id)
        return _to_receipt(row) if row is not None else None


def find_receipt_by_text_sha256(store: Store, sha: str) -> dict | None:
    """The newest receipt for exactly this text hash, or None."""
    with store.read() as session:
        row = session.scalar(select(ReceiptRow).where(ReceiptRow.text_sha256 == sha)
                             .order_by(ReceiptRow.stored_at.desc()).limit(1))
        return _to_receipt(row) if row is not None else None


def _validate(payload: dict) -> None:
    if not isinstance(payload.get("text_sha256"), str) or not _SHA256_RE.fullmatch(payload["text_sha256"]):
        raise ReceiptError("text_sha256 must be 64 lowercase hex digits")
    count = payload.get("token_count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ReceiptError("token_count must be a non-negative integer")
    for name, longest in (("model_id", 200), ("spec_fingerprint", 64)):
        if not isinstance(payload.get(name), str) or not 0 < len(payload[name]) <= longest:
            raise ReceiptError(f"{name} must be a non-empty string of at most {longest} characters")
    validate_key_id(payload.get("key_id"))
    if not isinstance(payload.get("created_at"), str) or not _TIME_RE.fullmatch(payload["created_at"]):
        raise ReceiptError("created_at must be ISO 8601 UTC like 2025-01-31T12:00:00.000000Z")
    if not isinstance(payload.get("receipt_id"), str) or not 0 < len(payload["receipt_id"]) <= 36:
        raise ReceiptError("receipt_id must be a string of at most 36 characters")


def _validate_links(links: ReceiptLinks) -> None:
    for name in ("issuer", "detector", "spec", "c2pa_manifest_id"):
        value = getattr(links, name)
        if not (value is None and name != "issuer") and not (isinstance(value, str) and 0 < len(value) <= 300):
            raise ReceiptError(f"{name} must be a non-empty string of at most 300 characters")


def _epoch(created_at: str) -> int:
    return int(datetime.strptime(created_at[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp())


def _to_receipt(row: ReceiptRow) -> dict:
    receipt = {**{name: getattr(row, name) for name in SIGNED_FIELDS}, "signature": row.signature,
               "signer_id": row.signer_id, "algorithm": ALGORITHM}
    if row.jws is not None:
        receipt["jws"] = row.jws
    return receipt
