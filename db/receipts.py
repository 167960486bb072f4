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

The private key lives in ``$PROVMARK_HOME/receipt-signing.key`` (mode 0600), sealed with AES-256-GCM
under a key derived (HKDF, its own purpose label) from the keyring's master key: the same source as
the watermark keyring (``PROVMARK_MASTER_KEY`` or ``master.key``, see ``watermark.keys``).
Receipts are stored with a ``generation`` audit event whose ``subject_sha256`` is the SHA-256 of the
JWS, so the transparency log's entry names the exact receipt; ``find_receipt_by_text_sha256`` links a
detected text to the receipt of the exact same text (provenance by exact match).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select

from db.audit import append_event, canonical_json
from db.audit_rows import row_digest
from db.manifests import ManifestRecord, add_manifest
from db.rows import ReceiptRow, iso_utc, new_id, utc_now
from db.store import Store
from provenance.jws import JwsError, ed25519_of, key_id, sign_compact, verify_compact
from provenance.sealed_key import SealedKeyError, SealedKeyFile, raw_public, signer_id
from provenance.signing_keys import RotatingSigningKey
from watermark.key_info import validate_key_id
from watermark.paths import provmark_home

SIGNING_KEY_FILE = "receipt-signing.key"
KEY_FORMAT = "provmark-receipt-key/1"
ALGORITHM = "Ed25519"
SIGNED_FIELDS = (
    "text_sha256", "token_count", "model_id", "spec_fingerprint", "key_id", "created_at", "receipt_id",
)
_HKDF_PURPOSE = b"provmark/receipts/signing-key-aes-gcm"
DEFAULT_ISSUER = "http://127.0.0.1:8000"  # the generation service of `make serve` (PROVMARK_ISSUER)
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


class ReceiptError(Exception):
    """A bad receipt request or an unusable signing-key file. Never contains key material."""


class ReceiptSigner:
    """The receipt signing key of one state folder: loaded, or created on first use; rotatable, and the
    keys it replaced stay in its JWKS (``provenance.signing_keys``)."""

    __slots__ = ("key", "path")

    def __init__(self, home: Path | None = None, master_key: bytes | None = None):
        home = Path(home).expanduser() if home is not None else provmark_home()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = home / SIGNING_KEY_FILE
        try:
            self.key = RotatingSigningKey(SealedKeyFile(self.path, KEY_FORMAT, _HKDF_PURPOSE, master_key))
        except SealedKeyError as error:
            raise ReceiptError(str(error)) from error

    def __repr__(self) -> str:
        return f"ReceiptSigner(signer_id={self.signer_id!r})"

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.key.private_key.public_key()

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
        return base64.b64encode(self.key.private_key.sign(canonical_json(payload))).decode()

    def sign_jws(self, claims: dict) -> str:
        """A compact JWS of ``claims`` (``provenance.jws``: alg Ed25519, kid, typ provmark-receipt+jwt)."""
        return sign_compact(self.key.private_key, claims)

    def jwks_keys(self) -> list[dict]:
        """The current key's public JWK, then every retired one (each with ``retired_at``)."""
        return self.key.jwks_keys()

    def rotate(self, store: Store, actor: str) -> dict:
        """A new signing key; the old one stays in the JWKS. Logged as a ``key.receipt_rotate`` event."""
        old, new = self.key.rotate(iso_utc(utc_now()))
        with store.write() as session:
            append_event(session, "key.receipt_rotate", actor, new["kid"],
                         {"retired_kid": old["kid"], "kid": new["kid"]})
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
    return verified.claims


def legacy_key_in(jwks: dict, signer: str) -> Ed25519PublicKey:
    """The key of ``jwks`` whose signer id is ``signer``: how a legacy receipt (no JWS) finds its key."""
    for jwk in jwks.get("keys", []) if isinstance(jwks, dict) else []:
        try:
            public = ed25519_of(jwk)
        except JwsError:
            continue
        if signer_id(public) == signer:
            return public
    raise ReceiptError(f"no key in the JWKS has the legacy receipt's signer id {signer!r}")


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


def store_receipt(store: Store, receipt: dict, actor: str, manifest: ManifestRecord | None = None) -> None:
    """Store a signed receipt and its ``generation`` audit event, and the C2PA manifest of the same text
    with its ``manifest`` event when there is one, in one transaction."""
    _validate(receipt)
    row = ReceiptRow(**{name: receipt[name] for name in SIGNED_FIELDS}, signer_id=receipt["signer_id"],
                     signature=receipt["signature"], jws=receipt.get("jws"), stored_at=utc_now())
    details = {name: receipt[name] for name in ("model_id", "key_id", "token_count", "spec_fingerprint")}
    details["row_sha256"] = row_digest(row)
    if row.jws is not None:  # what an outsider holding the receipt finds in the transparency log's entry
        details["subject_sha256"] = hashlib.sha256(row.jws.encode("ascii")).hexdigest()
    with store.write() as session:
        session.add(row)
        session.flush()
        append_event(session, "generation", actor, receipt["receipt_id"], details)
        if manifest is not None:
            add_manifest(session, manifest, actor)


def issue_receipt(store: Store, signer: ReceiptSigner, actor: str, manifest: ManifestRecord | None = None,
                  **fields) -> dict:
    """Sign (``sign_receipt`` fields) and store in one step, with the text's manifest if any; returns the
    receipt."""
    receipt = sign_receipt(signer, **fields)
    store_receipt(store, receipt, actor, manifest)
    return receipt


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
