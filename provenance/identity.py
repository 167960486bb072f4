"""A deployment's provenance identity: the Ed25519 keys that sign its receipts, its transparency log's heads
and its C2PA manifests (the development CA's root and signing key), as records every replica reads from one
shared place (``db.identity`` keeps them in the database).

A record is public except for its sealed private key: role, ``kid`` (the key's RFC 7638 thumbprint), the raw
public key, when it was created and retired, and for the C2PA roles its certificate. The private key is
sealed under the master key exactly as a key file is (``provenance.sealed_key``: AES-256-GCM, an HKDF
purpose per role, the public parts as associated data); a retired key keeps no private part. Every record
carries a MAC (HMAC-SHA256 under its own HKDF purpose) over all of its fields, so whoever can write the
table but does not hold the master key can neither add a key to the published JWKS nor move a retirement.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from provenance.jws import public_jwk
from provenance.log_key import jwk_thumbprint
from provenance.sealed_key import SealedKeyError, open_document, raw_public, seal_document
from watermark.key_info import KeyringError

RECEIPT, LOG, C2PA_ROOT, C2PA_SIGNER = "receipt", "log", "c2pa-root", "c2pa-signer"
# role -> (sealed key format, HKDF purpose): the same as the key files of a single-machine home used, so a
# home's files are adopted into the shared store as they are (``provenance.identity_files``)
SEALING = {
    RECEIPT: ("provmark-receipt-key/1", b"provmark/receipts/signing-key-aes-gcm"),
    LOG: ("provmark-log-key/1", b"provmark/log/signing-key-aes-gcm"),
    C2PA_ROOT: ("provmark-c2pa-root-key/1", b"provmark/c2pa/root-key-aes-gcm"),
    C2PA_SIGNER: ("provmark-c2pa-key/1", b"provmark/c2pa/signing-key-aes-gcm"),
}
ROLES = tuple(SEALING)
MAC_PURPOSE = b"provmark/identity/record-mac"
DEPLOYMENT_ID_HEX = 16


class IdentityError(Exception):
    """A missing, unreadable, forged or mismatched identity. Never contains key material."""


class IdentityMissing(IdentityError):
    """The deployment has no identity (or no key of a role) yet."""


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def parse_time(value: str) -> datetime:
    """An ISO 8601 UTC time as the project writes it (``2025-01-31T12:00:00.000000Z``, fraction optional)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """One key of the identity (module docstring). ``sealed`` is None once the key is retired."""

    role: str
    kid: str
    public_key: str  # base64 of the raw 32 bytes
    created_at: str
    retired_at: str | None
    certificate: str | None
    sealed: dict | None
    mac: str

    def public(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(self.public_key))

    def body(self) -> bytes:
        """The bytes the MAC covers: every field but the MAC."""
        return _canonical({"role": self.role, "kid": self.kid, "public_key": self.public_key,
                           "created_at": self.created_at, "retired_at": self.retired_at,
                           "certificate": self.certificate, "sealed": self.sealed})

    def jwk(self) -> dict:
        """The public JWK a JWKS lists for a receipt key (``retired_at`` on a retired one)."""
        members = {"retired_at": self.retired_at} if self.retired_at is not None else {}
        return public_jwk(self.public(), **members)


class IdentitySeal:
    """Seals, opens and authenticates records under the master key. ``derive(purpose)`` gives a 32-byte
    subkey (``watermark.keys.Keyring.derive_key``, or ``derive_existing_key`` where nothing may be created)."""

    __slots__ = ("_derive", "_mac_key")

    def __init__(self, derive: Callable[[bytes], bytes]):
        self._derive = derive
        self._mac_key: bytes | None = None

    def _subkey(self, purpose: bytes) -> bytes:
        try:
            return self._derive(purpose)
        except KeyringError as error:  # no master key here, or an unreadable one: say which, never its bytes
            raise IdentityError(f"the deployment's keys cannot be checked: {error}") from None

    def _mac(self, record: KeyRecord) -> str:
        if self._mac_key is None:
            self._mac_key = self._subkey(MAC_PURPOSE)
        return hmac.new(self._mac_key, record.body(), hashlib.sha256).hexdigest()

    def _aead(self, role: str) -> AESGCM:
        return AESGCM(self._subkey(SEALING[role][1]))

    def signed(self, record: KeyRecord) -> KeyRecord:
        """``record`` with its MAC computed."""
        return replace(record, mac=self._mac(replace(record, mac="")))

    def check(self, record: KeyRecord) -> KeyRecord:
        """``record`` if its MAC verifies; IdentityError otherwise."""
        if record.role not in SEALING:
            raise IdentityError(f"an identity record has the unknown role {record.role!r}")
        if not hmac.compare_digest(self._mac(replace(record, mac="")), record.mac or ""):
            raise IdentityError(f"the {record.role} key {record.kid} fails its authentication: it was written "
                                "without this deployment's master key, or this replica has another master key")
        return record

    def new(self, role: str, private_key: Ed25519PrivateKey, created_at: str,
            certificate: str | None = None) -> KeyRecord:
        """A current record sealing ``private_key``."""
        return self.adopted(role, seal_document(self._aead(role), SEALING[role][0], private_key), created_at,
                            certificate)

    def adopted(self, role: str, sealed: dict, created_at: str, certificate: str | None = None) -> KeyRecord:
        """A current record of an already sealed key (a home's key file, as it is); checked to open."""
        record = KeyRecord(role, "", "", created_at, None, certificate, sealed, "")
        public = self.open(record).public_key()
        return self.signed(replace(record, kid=jwk_thumbprint(public),
                                   public_key=base64.b64encode(raw_public(public)).decode()))

    def retired(self, role: str, public: Ed25519PublicKey, created_at: str, retired_at: str) -> KeyRecord:
        """A record of a key that signs no more: public parts only."""
        return self.signed(KeyRecord(role, jwk_thumbprint(public), base64.b64encode(raw_public(public)).decode(),
                                     created_at, retired_at, None, None, ""))

    def open(self, record: KeyRecord) -> Ed25519PrivateKey:
        """The private key of a current record; IdentityError if retired or it does not open."""
        if record.sealed is None:
            raise IdentityError(f"the {record.role} key {record.kid} is retired: it has no private part")
        try:
            return open_document(self._aead(record.role), SEALING[record.role][0], record.sealed,
                                 f"the {record.role} key")
        except SealedKeyError as error:
            raise IdentityError(str(error)) from None


@dataclass(frozen=True, slots=True)
class PublicIdentity:
    """What every replica publishes, from authenticated records: no private key is opened to build it."""

    records: tuple[KeyRecord, ...]

    def current(self, role: str) -> KeyRecord | None:
        return next((r for r in self.records if r.role == role and r.retired_at is None), None)

    def receipt_keys(self) -> list[KeyRecord]:
        """The current receipt key first, then the retired ones, oldest first."""
        current = self.current(RECEIPT)
        retired = sorted((r for r in self.records if r.role == RECEIPT and r.retired_at is not None),
                         key=lambda r: r.retired_at)
        return ([current] if current is not None else []) + retired

    def jwks(self) -> dict:
        return {"keys": [record.jwk() for record in self.receipt_keys()]}

    def log_key(self) -> Ed25519PublicKey:
        record = self.current(LOG)
        if record is None:
            raise IdentityMissing("the deployment has no log key")
        return record.public()

    def trust_anchor_pem(self) -> str:
        """The development CA's root certificate (PEM)."""
        record = self.current(C2PA_ROOT)
        if record is None or not record.certificate:
            raise IdentityMissing("the deployment has no development C2PA root")
        return record.certificate

    @property
    def deployment_id(self) -> str:
        """Names the deployment: a hash of the keys that never rotate (the log key, the C2PA root)."""
        fixed = sorted((r.role, r.public_key) for r in self.records if r.role in (LOG, C2PA_ROOT))
        return hashlib.sha256(_canonical(fixed)).hexdigest()[:DEPLOYMENT_ID_HEX]
