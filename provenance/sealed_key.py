"""Ed25519 private keys kept in a file sealed under the master key (receipts, the log, C2PA claims).

The file is JSON: ``format``, ``signer_id`` (16 hex digits of SHA-256 of the raw public key), the raw
public key (base64), and the raw private key under AES-256-GCM with a nonce of its own. The AES key is
derived with HKDF from the keyring's master key (``PROVMARK_MASTER_KEY`` or ``master.key``, see
``watermark.keys``) under a purpose label per use, so one file's key never opens another's; the
format, signer id and public key are the GCM associated data, so editing any of them is refused.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from watermark.keyring_seal import NONCE_BYTES
from watermark.keys import Keyring
from watermark.paths import PRIVATE_MODE

SIGNER_ID_HEX = 16  # 64 bits of SHA-256(raw public key): names a signer, like a key fingerprint


class SealedKeyError(Exception):
    """An unusable sealed key file. Never contains key material."""


def raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def signer_id(public_key: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public(public_key)).hexdigest()[:SIGNER_ID_HEX]


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class SealedKeyFile:
    """One sealed key file: ``load_or_create()`` returns its private key, creating it on first use.

    ``key_format`` names the file's kind (it is checked on load); ``purpose`` is the HKDF label that
    derives this file's AES key from the master key. ``keyring_home`` is the folder whose keyring holds
    that master key (default: the file's own folder), for key files kept in a sub-folder of the home.
    """

    __slots__ = ("_aead", "key_format", "path")

    def __init__(self, path: Path, key_format: str, purpose: bytes, master_key: bytes | None = None,
                 keyring_home: Path | None = None):
        self.path = Path(path)
        self.key_format = key_format
        self._aead = (sealing_aead(master_key, purpose) if master_key
                      else AESGCM(Keyring(keyring_home if keyring_home is not None
                                          else self.path.parent).derive_key(purpose)))

    def load_or_create(self) -> Ed25519PrivateKey:
        if not self.path.exists():
            self.write(Ed25519PrivateKey.generate(), replace=False)
        return self.load()

    def write(self, private_key: Ed25519PrivateKey, replace: bool) -> None:
        """Seal ``private_key`` into the file. A new file is linked into place, so a concurrent creator's
        key wins cleanly and is never overwritten; ``replace=True`` (rotation) swaps it atomically."""
        document = seal_document(self._aead, self.key_format, private_key)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), PRIVATE_MODE)
                f.write(json.dumps(document, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, self.path)
            else:
                with contextlib.suppress(FileExistsError):
                    os.link(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def load(self) -> Ed25519PrivateKey:
        return open_document(self._aead, self.key_format, read_sealed_document(self.path), str(self.path))


def read_sealed_document(path: Path) -> dict:
    """A sealed key file's JSON document (not opened); SealedKeyError if unreadable or readable by others."""
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise SealedKeyError(f"{path} is readable by other users (mode {mode:04o}): run `chmod 600 {path}`")
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SealedKeyError(f"{path} is damaged") from error
    if not isinstance(document, dict):
        raise SealedKeyError(f"{path} is damaged")
    return document


def sealing_aead(master_key: bytes, purpose: bytes) -> AESGCM:
    """The AES-GCM key of one purpose, derived (HKDF-SHA256) from a 32-byte master key."""
    return AESGCM(HKDF(hashes.SHA256(), 32, None, purpose).derive(master_key))


def _associated(key_format: str, signer: str, public_b64: str) -> bytes:
    return _canonical({"format": key_format, "signer_id": signer, "public_key": public_b64})


def seal_document(aead: AESGCM, key_format: str, private_key: Ed25519PrivateKey) -> dict:
    """``private_key`` sealed as a JSON-ready document: format, signer id and public key in clear (and bound
    as associated data), the raw private key under AES-GCM with a fresh nonce."""
    public_b64 = base64.b64encode(raw_public(private_key.public_key())).decode()
    signer = signer_id(private_key.public_key())
    raw_private = private_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    nonce = secrets.token_bytes(NONCE_BYTES)
    return {"format": key_format, "signer_id": signer, "public_key": public_b64,
            "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(
                aead.encrypt(nonce, raw_private, _associated(key_format, signer, public_b64))).decode()}


def open_document(aead: AESGCM, key_format: str, document: dict, where: str) -> Ed25519PrivateKey:
    """The private key a sealed document holds; SealedKeyError naming ``where`` (never key material)."""
    try:
        if document.get("format") != key_format:
            raise SealedKeyError(f"{where} is not a {key_format} key")
        nonce, sealed = base64.b64decode(document["nonce"]), base64.b64decode(document["ciphertext"])
        raw_private = aead.decrypt(nonce, sealed,
                                   _associated(key_format, document["signer_id"], document["public_key"]))
    except InvalidTag as error:
        raise SealedKeyError(f"{where} cannot be opened: wrong master key or the key was edited") from error
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error) as error:
        raise SealedKeyError(f"{where} is damaged") from error
    private_key = Ed25519PrivateKey.from_private_bytes(raw_private)
    if signer_id(private_key.public_key()) != document["signer_id"]:
        raise SealedKeyError(f"{where} is damaged: its key does not match its signer id")
    return private_key
