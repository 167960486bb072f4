"""A watermark key's public side: its id rule, lifecycle statuses, ``KeyInfo`` metadata, the secret's
fingerprint, and the errors the keyring raises. No secret is stored here (see watermark/keys.py)."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass

SECRET_BYTES = 32  # a 256-bit PRF key: no shorter than HMAC-SHA256's output (RFC 2104, section 3)
FINGERPRINT_HEX = 16  # 64 bits: tells keys apart, says nothing usable about the secret
KEY_ID_RULE = "[a-z0-9][a-z0-9_-]{0,31}"
KEY_ID_RE = re.compile(KEY_ID_RULE)

ACTIVE, STANDBY, ROTATED, RETIRED = "active", "standby", "rotated", "retired"
STATUSES = (ACTIVE, STANDBY, ROTATED, RETIRED)
DETECTION_STATUSES = frozenset({ACTIVE, STANDBY, ROTATED})


class KeyringError(Exception):
    """Any keyring failure. Messages never contain secret material."""


class KeyNotFoundError(KeyringError, KeyError):
    """No usable key under that id (or no active key)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class KeyExistsError(KeyringError):
    """A key id is already taken (ids are never reused: verdicts refer to them)."""


class InvalidKeyIdError(KeyringError, ValueError):
    """A key id that does not match ``KEY_ID_RULE``."""


class KeyStateError(KeyringError):
    """The operation does not fit the key's status (e.g. retiring the active key)."""


class MasterKeyError(KeyringError):
    """The master key is missing, malformed or stored unsafely."""


class KeyringIntegrityError(KeyringError):
    """The keyring file was edited, truncated or reordered outside provmark."""


class WrongMasterKeyError(KeyringIntegrityError):
    """The master key given is not the one that sealed this keyring."""


class KeySpecError(KeyringError, ValueError):
    """A key was asked for under a spec other than the one it is bound to (or an hf spec, which has no key)."""


@dataclass(slots=True, frozen=True)
class KeyInfo:
    """Public facts about one key; deliberately has no secret field."""

    key_id: str
    status: str
    created_at: str  # ISO 8601 UTC, e.g. 2025-01-31T12:00:00Z
    retired_at: str | None
    fingerprint: str  # first 16 hex of HMAC-SHA256(secret, "provmark/key-fingerprint")
    purged: bool = False  # retired and its secret erased
    spec: str | None = None  # the canonical kgw spec it watermarks with; None: made before specs were recorded
    public_half: bool = False  # a two-part key: its detection half may be published (watermark.public_key)

    @property
    def used_for_detection(self) -> bool:
        return self.status in DETECTION_STATUSES

    @property
    def usable_for_generation(self) -> bool:
        return self.status in (ACTIVE, STANDBY)

    def to_dict(self) -> dict:
        return asdict(self)

    def sealed_fields(self) -> dict:
        """The metadata sealed with the secret; ``spec`` only when recorded and ``public_half`` only when
        True, so keys made before these fields existed keep their original associated data and MAC."""
        out = asdict(self)
        if out["spec"] is None:
            del out["spec"]
        if not out["public_half"]:  # likewise: one-part keys keep the associated data they were sealed with
            del out["public_half"]
        return out



def new_secret() -> bytes:
    """A fresh key secret: SECRET_BYTES from the operating system's CSPRNG."""
    return secrets.token_bytes(SECRET_BYTES)


def key_fingerprint(secret: bytes) -> str:
    """Public, non-reversible short name of a secret so users can tell keys apart."""
    return hmac.new(secret, b"provmark/key-fingerprint", hashlib.sha256).hexdigest()[:FINGERPRINT_HEX]



def validate_key_id(key_id: str) -> str:
    """The id itself, or InvalidKeyIdError (which does not echo the bad value: it may be a pasted secret)."""
    if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
        raise InvalidKeyIdError(
            f"invalid key id: it must match {KEY_ID_RULE} (lowercase, at most 32 characters)"
        )
    return key_id

