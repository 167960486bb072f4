"""How the keyring file is sealed: the master key (parsed, formatted, HKDF-derived sub-keys), each secret
under AES-256-GCM with its metadata as associated data, and the HMAC-SHA256 over the whole entry list.
A wrong master key or any edited, deleted, reordered or swapped entry raises ``KeyringIntegrityError``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from watermark.key_info import (
    ACTIVE,
    FINGERPRINT_HEX,
    KEY_ID_RE,
    SECRET_BYTES,
    STATUSES,
    KeyInfo,
    KeyNotFoundError,
    KeyringIntegrityError,
    MasterKeyError,
    WrongMasterKeyError,
    key_fingerprint,
)

MASTER_KEY_ENV = "PROVMARK_MASTER_KEY"
FORMAT = "provmark-keyring/1"
MASTER_KEY_BYTES = 32  # AES-256 and HMAC-SHA256 strength
NONCE_BYTES = 12  # AES-GCM's 96-bit nonce (NIST SP 800-38D, 8.2.2 random construction)


def parse_master_key(text: str, source: str = MASTER_KEY_ENV) -> bytes:
    """32 bytes from 64 hex digits or 43 base64url characters; the error never echoes the value."""
    text = text.strip()
    if re.fullmatch(r"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text)
    if re.fullmatch(r"[A-Za-z0-9_-]{43}=?", text):
        return base64.urlsafe_b64decode(text[:43] + "=")
    raise MasterKeyError(
        f"{source} is malformed: expected {MASTER_KEY_BYTES} bytes as 64 hex digits or 43 base64url "
        f"characters (got {len(text)} characters)"
    )


def format_master_key(master_key: bytes) -> str:
    """The text form written to ``master.key`` (base64url, no padding)."""
    return base64.urlsafe_b64encode(master_key).decode().rstrip("=")


def _hkdf(master_key: bytes, purpose: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(master_key)


class MasterKeys:
    """Subkeys derived from the master key, one per purpose so none is used twice."""

    __slots__ = ("_master_key", "aead", "check", "mac_key", "source")

    def __init__(self, master_key: bytes, source: str):
        self._master_key = master_key
        self.aead = AESGCM(_hkdf(master_key, b"provmark/keyring/aes-gcm"))
        self.mac_key = _hkdf(master_key, b"provmark/keyring/file-mac")
        self.check = _hkdf(master_key, b"provmark/keyring/master-check").hex()[:FINGERPRINT_HEX]
        self.source = source

    def __repr__(self) -> str:
        return f"<master key from {self.source}>"

    def derive(self, purpose: bytes) -> bytes:
        if purpose.startswith(b"provmark/keyring/"):
            raise ValueError("purpose: the provmark/keyring/ labels are the keyring's own")
        return _hkdf(self._master_key, purpose)


@dataclass(slots=True)
class SealedEntry:
    """One stored key: public info + its sealed secret (None once purged)."""

    info: KeyInfo
    nonce: str | None
    ciphertext: str | None


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _associated_data(info: KeyInfo) -> bytes:
    return _canonical({"format": FORMAT, **info.sealed_fields()})


def seal(keys: MasterKeys, info: KeyInfo, secret: bytes) -> SealedEntry:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return SealedEntry(info, _b64(nonce), _b64(keys.aead.encrypt(nonce, secret, _associated_data(info))))


def open_secret(keys: MasterKeys, entry: SealedEntry) -> bytes:
    key_id = entry.info.key_id
    if entry.info.purged or entry.nonce is None or entry.ciphertext is None:
        raise KeyNotFoundError(f"key {key_id} was retired with purge: its secret no longer exists")
    try:
        secret = keys.aead.decrypt(
            base64.b64decode(entry.nonce, validate=True),
            base64.b64decode(entry.ciphertext, validate=True),
            _associated_data(entry.info),
        )
    except (InvalidTag, ValueError) as exc:
        raise KeyringIntegrityError(
            f"key {key_id}: sealed secret does not match its metadata (file tampered)"
        ) from exc
    if len(secret) != SECRET_BYTES or key_fingerprint(secret) != entry.info.fingerprint:
        raise KeyringIntegrityError(f"key {key_id}: secret does not match its fingerprint (file tampered)")
    return secret


def document_body(entries: list[SealedEntry], keys: MasterKeys) -> dict:
    return {
        "format": FORMAT,
        "master_key_check": keys.check,
        "entries": [{**e.info.sealed_fields(), "nonce": e.nonce, "ciphertext": e.ciphertext} for e in entries],
    }


def document_mac(body: dict, mac_key: bytes) -> str:
    return hmac.new(mac_key, _canonical(body), hashlib.sha256).hexdigest()


def _parse_entry(raw: dict) -> SealedEntry:
    fields = ("key_id", "status", "created_at", "retired_at", "fingerprint", "purged")
    if not isinstance(raw, dict) or set(raw) - {"spec", "public_half"} != {*fields, "nonce", "ciphertext"}:
        raise KeyringIntegrityError("keyring file has a malformed entry")
    if not (raw.get("spec") is None or isinstance(raw["spec"], str)):
        raise KeyringIntegrityError("keyring file has an entry with an invalid spec")
    if raw.get("public_half", True) is not True:  # written only when True (KeyInfo.sealed_fields)
        raise KeyringIntegrityError("keyring file has an entry with an invalid public_half")
    info = KeyInfo(**{name: raw[name] for name in fields}, spec=raw.get("spec"),
                   public_half="public_half" in raw)
    valid_id = isinstance(info.key_id, str) and KEY_ID_RE.fullmatch(info.key_id)
    if not valid_id or info.status not in STATUSES:
        raise KeyringIntegrityError("keyring file has an entry with an invalid id or status")
    return SealedEntry(info, raw["nonce"], raw["ciphertext"])


def parse_document(data: bytes, keys: MasterKeys, path: Path) -> list[SealedEntry]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyringIntegrityError(f"{path} is not valid JSON (damaged or edited)") from exc
    if not isinstance(doc, dict) or set(doc) != {"format", "master_key_check", "entries", "mac"}:
        raise KeyringIntegrityError(f"{path} is not a provmark keyring")
    if doc["format"] != FORMAT:
        raise KeyringIntegrityError(f"{path} has unknown format {str(doc['format'])[:40]!r}")
    if not hmac.compare_digest(str(doc["master_key_check"]), keys.check):
        raise WrongMasterKeyError(
            f"the master key from {keys.source} does not open {path} (wrong master key)"
        )
    body = {name: doc[name] for name in ("format", "master_key_check", "entries")}
    if not hmac.compare_digest(str(doc["mac"]), document_mac(body, keys.mac_key)):
        raise KeyringIntegrityError(
            f"{path} failed authentication: entries were edited, removed or reordered"
        )
    if not isinstance(doc["entries"], list):
        raise KeyringIntegrityError(f"{path} is not a provmark keyring")
    entries = [_parse_entry(raw) for raw in doc["entries"]]
    for entry in entries:
        if not entry.info.purged:
            open_secret(keys, entry)  # proves every sealed secret still matches its metadata
    duplicate_ids = len({e.info.key_id for e in entries}) != len(entries)
    if duplicate_ids or sum(e.info.status == ACTIVE for e in entries) > 1:
        raise KeyringIntegrityError(f"{path} has duplicate ids or several active keys")
    return entries

