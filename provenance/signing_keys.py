"""A signing key that rotates: the current Ed25519 key in a sealed file, the keys it replaced kept public.

Rotation seals a new key into the same file and moves the old one's public JWK into a list beside it
(``<file>.retired.json``), so everything the old key signed still verifies from the JWKS. Processes that
hold the key notice a rotation by the file's change time and load the new key before their next
signature.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from provenance.jws import public_jwk
from provenance.sealed_key import SealedKeyFile
from watermark.paths import PRIVATE_MODE

RETIRED_FORMAT = "provmark-retired-keys/1"


class SigningKeyError(Exception):
    """An unreadable list of retired keys; the message names the file."""


class RotatingSigningKey:
    """The current private key of ``sealed`` (created on first use) and the public keys it replaced."""

    __slots__ = ("_lock", "_private_key", "_stamp", "retired_path", "sealed")

    def __init__(self, sealed: SealedKeyFile):
        self.sealed = sealed
        self.retired_path = sealed.path.with_name(sealed.path.name + ".retired.json")
        self._lock = threading.Lock()
        self._private_key = sealed.load_or_create()
        self._stamp = _stamp(sealed.path)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The current key; reloaded when another process rotated it (one stat per call)."""
        stamp = _stamp(self.sealed.path)
        if stamp is not None and stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._private_key, self._stamp = self.sealed.load(), stamp
        return self._private_key

    def rotate(self, retired_at: str) -> tuple[dict, dict]:
        """A new current key; the old one's public JWK joins the retired list. Returns (old, new) JWKs."""
        with self._lock:
            old = public_jwk(self.private_key.public_key(), retired_at=retired_at)
            retired = [key for key in self.retired() if key.get("kid") != old["kid"]] + [old]
            _write_json(self.retired_path, {"format": RETIRED_FORMAT, "keys": retired})
            self.sealed.write(Ed25519PrivateKey.generate(), replace=True)
            self._private_key, self._stamp = self.sealed.load(), _stamp(self.sealed.path)
            return old, public_jwk(self._private_key.public_key())

    def retired(self) -> list[dict]:
        """The public JWKs of the keys this one replaced, oldest first."""
        try:
            document = json.loads(self.retired_path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as error:
            raise SigningKeyError(f"{self.retired_path} cannot be read ({error})") from None
        if not isinstance(document, dict) or document.get("format") != RETIRED_FORMAT:
            raise SigningKeyError(f"{self.retired_path} is not a list of retired keys")
        return [key for key in document.get("keys", []) if isinstance(key, dict)]

    def jwks_keys(self, **current_members) -> list[dict]:
        """The current key's public JWK first, then every retired one."""
        return [public_jwk(self.private_key.public_key(), **current_members), *self.retired()]


def _stamp(path: Path) -> tuple[int, int] | None:
    """The file's identity and change time; None when it is gone (the key in memory stays usable)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_ino, info.st_mtime_ns


def _write_json(path: Path, document: dict) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(document, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
