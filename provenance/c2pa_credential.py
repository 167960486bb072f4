"""The X.509 credential that signs C2PA manifests for generated text.

Development (no chain configured): on first use, ``$PROVMARK_HOME/c2pa/`` gets

    root.pem     the development CA's certificate (10 years): the trust anchor verifiers are given
    chain.pem    the signing certificate (2 years), as it goes into every manifest's x5chain
    root.key     the CA's Ed25519 key, sealed under the master key (it re-issues the signing certificate)
    signer.key   the signing Ed25519 key, sealed under the master key (``provenance.sealed_key``)

and later loads reuse them. The signing certificate is re-issued under the same root when it has less
than 30 days left, so verifiers keep the one root.pem for ten years.

Production: ``C2paSettings(cert_chain=..., private_key=...)`` loads a PEM chain (signing certificate
first) and its unencrypted PEM private key (Ed25519, or ECDSA P-256 for ES256). Either way a
certificate that expires within 7 days, is not yet valid, lacks a C2PA signing EKU, or does not match
the key is refused with ``C2paCredentialError`` (which never contains key material).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from provenance.c2pa_x509 import (
    SigningKey,
    has_digital_signature,
    is_ca,
    is_self_signed,
    make_root,
    make_signing_cert,
    public_key_der,
    signing_ekus,
    to_pem,
)
from provenance.sealed_key import SealedKeyError, SealedKeyFile
from watermark.paths import PRIVATE_MODE, provmark_home, write_private_atomic

DEV_FOLDER = "c2pa"
ROOT_DAYS = 3650
SIGNER_DAYS = 730
RENEW_BEFORE = timedelta(days=30)  # the development signing certificate is re-issued this long before expiry
MIN_VALIDITY_LEFT = timedelta(days=7)  # a certificate closer to expiry than this is refused
_ROOT_KEY = ("root.key", "provmark-c2pa-root-key/1", b"provmark/c2pa/root-key-aes-gcm")
_SIGNER_KEY = ("signer.key", "provmark-c2pa-key/1", b"provmark/c2pa/signing-key-aes-gcm")
_PUBLIC_MODE = 0o644  # root.pem and chain.pem hold no secret; verifiers are meant to get them
_URL_RE = re.compile(r"https?://[^\s]+")


class C2paCredentialError(Exception):
    """An unusable C2PA credential or credential setting. Never contains key material."""


@dataclass(frozen=True)
class C2paSettings:
    """Where the C2PA credential comes from. All ``None``: the development CA of the home folder.

    cert_chain      PROVMARK_C2PA_CERT_CHAIN      PEM certificates, the signing certificate first
    private_key     PROVMARK_C2PA_PRIVATE_KEY     its unencrypted PEM private key (Ed25519 or P-256)
    tsa_url         PROVMARK_C2PA_TSA_URL         an RFC 3161 time-stamp authority (http or https)
    trust_anchors   PROVMARK_C2PA_TRUST_ANCHORS   PEM roots the reading side trusts; default: the
                                                  development root, or the chain's own self-signed root
    """

    cert_chain: Path | None = None
    private_key: Path | None = None
    tsa_url: str | None = None
    trust_anchors: Path | None = None

    def __post_init__(self):
        if (self.cert_chain is None) != (self.private_key is None):
            raise C2paCredentialError(
                "PROVMARK_C2PA_CERT_CHAIN and PROVMARK_C2PA_PRIVATE_KEY are set together or not at all")
        if self.tsa_url is not None and not _URL_RE.fullmatch(self.tsa_url):
            raise C2paCredentialError("PROVMARK_C2PA_TSA_URL must be an http:// or https:// URL")


@dataclass(frozen=True, eq=False)
class C2paCredential:
    """A loaded signing credential: the x5chain, the key (held by ``cryptography``, never handed to
    c2pa), the trust anchors readers of this service use, and an optional time-stamp authority."""

    chain_pem: str
    trust_anchors_pem: str
    algorithm: str  # "ed25519" or "es256"
    tsa_url: str | None
    not_after: datetime
    source: str  # "development" or "production"
    signing_key: SigningKey = field(repr=False)
    # the c2pa-native objects made for this credential, one set per thread (provenance.c2pa_native)
    per_thread: threading.local = field(default_factory=threading.local, init=False, repr=False)

    def sign(self, data: bytes) -> bytes:
        """The raw COSE signature over ``data``: Ed25519, or ES256 as r || s (32 bytes each)."""
        if isinstance(self.signing_key, ed25519.Ed25519PrivateKey):
            return self.signing_key.sign(data)
        r, s = decode_dss_signature(self.signing_key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def load_c2pa_credential(settings: C2paSettings | None = None, home: Path | None = None,
                         now: datetime | None = None) -> C2paCredential:
    """The credential ``settings`` name, checked: a production chain and key, or (no chain set) the
    development CA of ``home`` (default ``provmark_home()``), created on first use and reused after.
    Raises ``C2paCredentialError`` for anything unusable."""
    settings = settings or C2paSettings()
    now = now or datetime.now(UTC)
    if settings.cert_chain is not None:
        chain = _read_certificates(settings.cert_chain)
        key = _read_private_key(settings.private_key)
        if settings.trust_anchors is not None:
            anchors = to_pem(*_read_certificates(settings.trust_anchors))
        else:
            anchors = to_pem(chain[-1]) if len(chain) > 1 and is_self_signed(chain[-1]) else ""
        return _checked(chain, key, anchors, settings.tsa_url, now, "production", str(settings.cert_chain))
    home = Path(home).expanduser() if home is not None else provmark_home()
    root, leaf, key = _development_ca(home, now)
    anchors = to_pem(*_read_certificates(settings.trust_anchors)) if settings.trust_anchors else to_pem(root)
    return _checked([leaf], key, anchors, settings.tsa_url, now, "development", str(home / DEV_FOLDER))


def _checked(chain: list[x509.Certificate], key, anchors: str, tsa_url: str | None, now: datetime,
             source: str, where: str) -> C2paCredential:
    leaf = chain[0]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        algorithm = "ed25519"
    elif isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        algorithm = "es256"
    else:
        raise C2paCredentialError(f"{where}: the private key must be Ed25519 or ECDSA P-256")
    if is_ca(leaf):
        raise C2paCredentialError(f"{where}: the first certificate is a CA; the signing certificate comes first")
    if public_key_der(leaf.public_key()) != public_key_der(key):
        raise C2paCredentialError(f"{where}: the private key does not match the signing certificate")
    if now < leaf.not_valid_before_utc:
        raise C2paCredentialError(f"{where}: the signing certificate is not valid before "
                                  f"{leaf.not_valid_before_utc.isoformat()}")
    if leaf.not_valid_after_utc - now < MIN_VALIDITY_LEFT:
        raise C2paCredentialError(f"{where}: the signing certificate expires at "
                                  f"{leaf.not_valid_after_utc.isoformat()} (under {MIN_VALIDITY_LEFT.days} "
                                  "days left): renew it")
    if not has_digital_signature(leaf):
        raise C2paCredentialError(f"{where}: the signing certificate lacks the digitalSignature key usage")
    if not signing_ekus(leaf):
        raise C2paCredentialError(f"{where}: the signing certificate has no C2PA signing EKU (c2pa-kp-"
                                  "claimSigning, id-kp-documentSigning or id-kp-emailProtection)")
    for child, parent in zip(chain, chain[1:], strict=False):
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature) as error:
            raise C2paCredentialError(f"{where}: the chain is not in order (each certificate is followed "
                                      "by its issuer)") from error
    return C2paCredential(chain_pem=to_pem(*chain), trust_anchors_pem=anchors, algorithm=algorithm,
                          tsa_url=tsa_url, not_after=leaf.not_valid_after_utc, source=source, signing_key=key)


def _read_certificates(path: Path) -> list[x509.Certificate]:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise C2paCredentialError(f"{path} cannot be read ({error.strerror})") from error
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise C2paCredentialError(f"{path} is not a PEM certificate file") from error
    return certificates


def _read_private_key(path: Path) -> SigningKey:
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise C2paCredentialError(f"{path} cannot be read ({error.strerror})") from error
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # from None: the parser's message may quote the file
        raise C2paCredentialError(f"{path} is not an unencrypted PEM private key") from None


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, PRIVATE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one process creates or renews; the others then read its files
        yield
    finally:
        os.close(fd)


def _sealed_key(home: Path, folder: Path, spec: tuple[str, str, bytes]) -> ed25519.Ed25519PrivateKey:
    name, key_format, purpose = spec
    try:
        return SealedKeyFile(folder / name, key_format, purpose, keyring_home=home).load_or_create()
    except SealedKeyError as error:
        raise C2paCredentialError(str(error)) from error


def _write_public(path: Path, text: str) -> None:
    write_private_atomic(path, text.encode())
    path.chmod(_PUBLIC_MODE)


def _development_ca(home: Path, now: datetime) -> tuple[x509.Certificate, x509.Certificate, SigningKey]:
    folder = home / DEV_FOLDER
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(folder):
        root_key = _sealed_key(home, folder, _ROOT_KEY)
        signer_key = _sealed_key(home, folder, _SIGNER_KEY)
        root_path, chain_path = folder / "root.pem", folder / "chain.pem"
        if root_path.exists():
            root = _read_certificates(root_path)[0]
            if public_key_der(root.public_key()) != public_key_der(root_key):
                raise C2paCredentialError(f"{root_path} does not belong to {folder / 'root.key'}")
            if root.not_valid_after_utc - now < RENEW_BEFORE:
                raise C2paCredentialError(f"the development root {root_path} expires at "
                                          f"{root.not_valid_after_utc.isoformat()}: move {folder} away to "
                                          "make a new one (verifiers then need the new root.pem)")
        else:
            root = make_root(root_key, now, ROOT_DAYS)
            _write_public(root_path, to_pem(root))
        leaf = _read_certificates(chain_path)[0] if chain_path.exists() else None
        if leaf is None or not _current(leaf, root, signer_key, now):
            leaf = make_signing_cert(root, root_key, signer_key, now, SIGNER_DAYS)
            _write_public(chain_path, to_pem(leaf))
    return root, leaf, signer_key


def _current(leaf: x509.Certificate, root: x509.Certificate, key: SigningKey, now: datetime) -> bool:
    """Whether the stored signing certificate is still the one to use (else it is re-issued)."""
    try:
        leaf.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return (public_key_der(leaf.public_key()) == public_key_der(key)
            and leaf.not_valid_after_utc - now >= RENEW_BEFORE)
