"""The key secrets a batch job ships to its workers (``KeySecrets``: ids and 32-byte PRF secrets only, never
the master key or the keyring file), their AES-256-GCM sealing for Ray's object store (``seal_secrets`` /
``open_secrets`` under a fresh per-job transport key), and the in-memory keyring a worker's ``Detector``
reads them through. See detector/batch.py for what travels where."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from watermark.key_info import KeyNotFoundError, KeyringError
from watermark.public_key import public_half_id

TRANSPORT_KEY_ENV = "PROVMARK_BATCH_TRANSPORT_KEY"
# the detect-scope dither's key (detector.service.dither_key_of) travels as one more entry; not a valid key id
DITHER_ID = "provmark/detect-dither"
SEAL_CONTEXT = b"provmark/batch-secrets/1"  # AES-GCM associated data: a sealed bundle means only this
NONCE_BYTES = 12  # AES-GCM's 96-bit nonce (NIST SP 800-38D)


class KeySecrets:
    """key id -> 32-byte PRF secret, for the keys a batch tests; repr and str name ids only."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: dict[str, bytes]) -> None:
        self._secrets = {str(k): bytes(v) for k, v in secrets.items()}

    def __repr__(self) -> str:
        return f"KeySecrets(key_ids={sorted(self._secrets)!r})"

    __str__ = __repr__

    def __getstate__(self):
        return self._secrets

    def __setstate__(self, state) -> None:
        self._secrets = state

    def secret(self, key_id: str) -> bytes:
        try:
            return self._secrets[key_id]
        except KeyError:
            raise KeyNotFoundError(f"key {key_id!r} was not sent to this worker") from None

    def get(self, key_id: str) -> bytes | None:
        return self._secrets.get(key_id)


def seal_secrets(secrets: KeySecrets) -> tuple[bytes, str]:
    """(AES-256-GCM sealed bundle, transport key as hex) under a fresh random key."""
    key, nonce = os.urandom(32), os.urandom(NONCE_BYTES)
    plain = json.dumps({k: v.hex() for k, v in secrets.__getstate__().items()}).encode()
    return nonce + AESGCM(key).encrypt(nonce, plain, SEAL_CONTEXT), key.hex()


def open_secrets(sealed: bytes, key_hex: str) -> KeySecrets:
    try:
        plain = AESGCM(bytes.fromhex(key_hex)).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], SEAL_CONTEXT)
    except (InvalidTag, ValueError):
        raise KeyringError("the sealed key bundle does not open with this job's transport key") from None
    return KeySecrets({k: bytes.fromhex(v) for k, v in json.loads(plain).items()})


class SecretsKeyring:
    """What ``Detector`` needs of a keyring, from secrets in memory (no file: it never reloads)."""

    path = Path("/nonexistent/provmark-batch-worker/keyring.json")

    def __init__(self, secrets: KeySecrets) -> None:
        self._secrets = secrets

    def __repr__(self) -> str:
        return f"SecretsKeyring({self._secrets!r})"

    def secret(self, key_id: str) -> bytes:
        return self._secrets.secret(key_id)

    def public_half_of(self, key_id: str) -> bytes | None:
        """A two-part key's published half when the batch shipped one (``watermark.public_key.public_half_id``)."""
        try:
            return self._secrets.secret(public_half_id(key_id))
        except KeyNotFoundError:
            return None

    def detection_keys(self):  # prepare_jobs always names the keys
        raise KeyringError("batch workers are given explicit key ids")
