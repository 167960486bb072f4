"""The transparency log's signing key: the deployment's log key (``db.identity``), or for a standalone
log a key file sealed under the master key (``provenance.sealed_key``, its own HKDF purpose).

The log's origin (the checkpoint's first line and the note key's name) is ``provmark.log/<signer id>``:
16 hex digits of SHA-256 of the raw public key, so a log is named by its key.
"""

from __future__ import annotations

import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from provenance.log_key import (
    jwk_thumbprint,
    log_id,
    public_jwk,
    public_pem,
    verifier_key,
)
from provenance.sealed_key import SealedKeyError, SealedKeyFile, signer_id
from provenance.tree_head import TreeHead, sign_tree_head
from watermark.paths import provmark_home

LOG_KEY_FILE = "log-signing.key"
LOG_KEY_FORMAT = "provmark-log-key/1"
LOG_KEY_PURPOSE = b"provmark/log/signing-key-aes-gcm"
ORIGIN_PREFIX = "provmark.log/"


class LogKeyFileError(Exception):
    """The log key file cannot be opened (wrong master key, damaged, readable by others). No key material."""


def log_key_file(home: Path, master_key: bytes | None = None) -> SealedKeyFile:
    return SealedKeyFile(Path(home) / LOG_KEY_FILE, LOG_KEY_FORMAT, LOG_KEY_PURPOSE, master_key)


def origin_of(public_key: Ed25519PublicKey) -> str:
    return ORIGIN_PREFIX + signer_id(public_key)


class LogSigner:
    """A log key: signs tree heads and publishes its public forms. ``private_key``: the deployment's log
    key; without it, the key file of the state folder ``home`` (created on first use)."""

    __slots__ = ("_private_key", "origin", "public_key")

    def __init__(self, home: Path | None = None, master_key: bytes | None = None,
                 private_key: Ed25519PrivateKey | None = None):
        if private_key is None:
            home = Path(home).expanduser() if home is not None else provmark_home()
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                private_key = log_key_file(home, master_key).load_or_create()
            except SealedKeyError as error:
                raise LogKeyFileError(str(error)) from None
        self._private_key = private_key
        self.public_key = self._private_key.public_key()
        self.origin = origin_of(self.public_key)

    def __repr__(self) -> str:
        return f"LogSigner(origin={self.origin!r})"

    @property
    def key_id(self) -> str:
        return jwk_thumbprint(self.public_key)

    def sign(self, tree_size: int, root_hash: bytes, timestamp: int | None = None) -> TreeHead:
        """A head for (tree_size, root_hash) signed now (``timestamp``: milliseconds since the epoch)."""
        stamp = timestamp if timestamp is not None else time.time_ns() // 1_000_000
        return sign_tree_head(self._private_key, self.origin, tree_size, root_hash, stamp)

    def public_document(self) -> dict:
        """What the service publishes: the JWK (and a JWKS of it), PEM, checkpoint verifier key, ids."""
        return public_document(self.public_key)


def public_document(public_key: Ed25519PublicKey) -> dict:
    """A log key's published forms: the JWK (and a JWKS of it), PEM, checkpoint verifier key, ids."""
    jwk = public_jwk(public_key)
    origin = origin_of(public_key)
    return {"key_id": jwk["kid"], "log_id": log_id(public_key), "origin": origin, "jwk": jwk,
            "jwks": {"keys": [jwk]}, "pem": public_pem(public_key), "verifier_key": verifier_key(origin, public_key)}

