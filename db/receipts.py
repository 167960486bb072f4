"""Generation receipts: Ed25519 signatures over what was generated, verifiable offline.

A receipt is the JSON object of ``SIGNED_FIELDS`` plus ``signature`` (base64 Ed25519 over the
canonical JSON of exactly those fields: sorted keys, no whitespace, UTF-8), ``signer_id`` and
``algorithm``. Anyone with the public key (PEM or raw base64, see ``ReceiptSigner``) can check one
with ``verify_receipt`` and nothing else; ``signer_id`` only says which public key to use.

The private key lives in ``$PROVMARK_HOME/receipt-signing.key`` (mode 0600), sealed with AES-256-GCM
under a key derived (HKDF, its own purpose label) from the keyring's master key: the same source as
the watermark keyring (``PROVMARK_MASTER_KEY`` or ``master.key``, see ``watermark.keys``).
Receipts are stored with a ``generation`` audit event; ``find_receipt_by_text_sha256`` links a
detected text to the receipt of the exact same text (provenance by exact match).
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import select

from db.audit import append_event, canonical_json
from db.audit_rows import row_digest
from db.rows import ReceiptRow, iso_utc, new_id, utc_now
from db.store import Store
from provenance.sealed_key import SealedKeyError, SealedKeyFile, raw_public, signer_id
from watermark.key_info import validate_key_id
from watermark.paths import provmark_home

SIGNING_KEY_FILE = "receipt-signing.key"
KEY_FORMAT = "provmark-receipt-key/1"
ALGORITHM = "Ed25519"
SIGNED_FIELDS = (
    "text_sha256", "token_count", "model_id", "spec_fingerprint", "key_id", "created_at", "receipt_id",
)
_HKDF_PURPOSE = b"provmark/receipts/signing-key-aes-gcm"
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_TIME_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")


class ReceiptError(Exception):
    """A bad receipt request or an unusable signing-key file. Never contains key material."""


class ReceiptSigner:
    """The receipt signing key of one state folder: loaded, or created on first use."""

    __slots__ = ("_private_key", "path", "public_key", "signer_id")

    def __init__(self, home: Path | None = None, master_key: bytes | None = None):
        home = Path(home).expanduser() if home is not None else provmark_home()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = home / SIGNING_KEY_FILE
        try:
            self._private_key = SealedKeyFile(self.path, KEY_FORMAT, _HKDF_PURPOSE, master_key).load_or_create()
        except SealedKeyError as error:
            raise ReceiptError(str(error)) from error
        self.public_key = self._private_key.public_key()
        self.signer_id = signer_id(self.public_key)

    def __repr__(self) -> str:
        return f"ReceiptSigner(signer_id={self.signer_id!r})"

    def public_key_pem(self) -> str:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def public_key_b64(self) -> str:
        return base64.b64encode(raw_public(self.public_key)).decode()

    def sign(self, payload: dict) -> str:
        """Base64 Ed25519 signature over the canonical JSON of ``payload``."""
        return base64.b64encode(self._private_key.sign(canonical_json(payload))).decode()


def sign_receipt(signer: ReceiptSigner, *, text_sha256: str, token_count: int, model_id: str,
                 spec_fingerprint: str, key_id: str, created_at: str | None = None,
                 receipt_id: str | None = None) -> dict:
    """A signed receipt (a JSON-ready dict); fields are validated first, naming the bad one."""
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
    signature = signer.sign(payload)
    return {**payload, "signature": signature, "signer_id": signer.signer_id, "algorithm": ALGORITHM}


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


def store_receipt(store: Store, receipt: dict, actor: str) -> None:
    """Store a signed receipt and its ``generation`` audit event in one transaction."""
    _validate(receipt)
    row = ReceiptRow(**{name: receipt[name] for name in SIGNED_FIELDS}, signer_id=receipt["signer_id"],
                     signature=receipt["signature"], stored_at=utc_now())
    details = {name: receipt[name] for name in ("model_id", "key_id", "token_count", "spec_fingerprint")}
    details["row_sha256"] = row_digest(row)
    with store.write() as session:
        session.add(row)
        session.flush()
        append_event(session, "generation", actor, receipt["receipt_id"], details)


def issue_receipt(store: Store, signer: ReceiptSigner, actor: str, **fields) -> dict:
    """Sign (``sign_receipt`` fields) and store in one step; returns the receipt."""
    receipt = sign_receipt(signer, **fields)
    store_receipt(store, receipt, actor)
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


def _to_receipt(row: ReceiptRow) -> dict:
    return {**{name: getattr(row, name) for name in SIGNED_FIELDS}, "signature": row.signature,
            "signer_id": row.signer_id, "algorithm": ALGORITHM}
