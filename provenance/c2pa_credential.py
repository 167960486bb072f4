"""The X.509 credential that signs C2PA manifests for generated text.

Development (no chain configured): the deployment's development CA (``DevelopmentCa``), made once with
its identity (``db.identity``): a root certificate (10 years), the trust anchor verifiers are given, and a
signing certificate (2 years) under it, as it goes into every manifest's x5chain; both keys are Ed25519,
sealed under the master key. The signing certificate is re-issued under the same root when it has less
than 30 days left (``renewed_signer``), so verifiers keep the one root for ten years.

Production: ``C2paSettings(cert_chain=..., private_key=..., trust_anchors=...)`` loads a PEM chain (signing
certificate first), its unencrypted PEM private key (Ed25519, or ECDSA P-256 for ES256) and the roots
verifiers trust, which must be named: the chain's own root is never assumed to be one (a public CA's root
would make any S/MIME certificate under it read as trusted). Either way a certificate that expires within
7 days, is not yet valid, lacks a C2PA signing EKU, or does not match the key is refused with
``C2paCredentialError`` (which never contains key material).
"""

from __future__ import annotations

import re
import threading
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
    make_root,
    make_signing_cert,
    public_key_der,
    signing_ekus,
    to_pem,
)

ROOT_DAYS = 3650
SIGNER_DAYS = 730
RENEW_BEFORE = timedelta(days=30)  # the development signing certificate is re-issued this long before expiry
MIN_VALIDITY_LEFT = timedelta(days=7)  # a certificate closer to expiry than this is refused
_URL_RE = re.compile(r"https?://[^\s]+")


class C2paCredentialError(Exception):
    """An unusable C2PA credential or credential setting. Never contains key material."""


@dataclass(frozen=True)
class C2paSettings:
    """Where the C2PA credential comes from. All ``None``: the deployment's development CA.

    cert_chain      PROVMARK_C2PA_CERT_CHAIN      PEM certificates, the signing certificate first
    private_key     PROVMARK_C2PA_PRIVATE_KEY     its unencrypted PEM private key (Ed25519 or P-256)
    tsa_url         PROVMARK_C2PA_TSA_URL         an RFC 3161 time-stamp authority (http or https)
    trust_anchors   PROVMARK_C2PA_TRUST_ANCHORS   PEM roots the reading side trusts; default: the
                                                  development root; required with a production chain
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


@dataclass(frozen=True)
class DevelopmentCa:
    """The deployment's development CA: root certificate and key, signing key and its certificate (PEM)."""

    root_pem: str
    root_key: ed25519.Ed25519PrivateKey = field(repr=False)
    signer_key: ed25519.Ed25519PrivateKey = field(repr=False)
    signer_pem: str


def new_development_ca(now: datetime) -> tuple[ed25519.Ed25519PrivateKey, str, ed25519.Ed25519PrivateKey, str]:
    """A fresh development CA: (root key, root PEM, signing key, signing certificate PEM)."""
    root_key, signer_key = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    root = make_root(root_key, now, ROOT_DAYS)
    return root_key, to_pem(root), signer_key, to_pem(make_signing_cert(root, root_key, signer_key, now, SIGNER_DAYS))


def renewed_signer(ca: DevelopmentCa, now: datetime) -> str | None:
    """A new signing certificate (PEM) under the same root when the stored one is no longer the one to use
    (under 30 days left, another key, another issuer); None when it still is."""
    root = _parse_certificates(ca.root_pem, "the development root")[0]
    if public_key_der(root.public_key()) != public_key_der(ca.root_key):
        raise C2paCredentialError("the development root certificate does not belong to its key")
    if root.not_valid_after_utc - now < RENEW_BEFORE:
        raise C2paCredentialError(f"the development root expires at {root.not_valid_after_utc.isoformat()}: "
                                  "make a new deployment CA (verifiers then need the new root)")
    leaf = _parse_certificates(ca.signer_pem, "the development signing certificate")[0]
    if _current(leaf, root, ca.signer_key, now):
        return None
    return to_pem(make_signing_cert(root, ca.root_key, ca.signer_key, now, SIGNER_DAYS))


def load_c2pa_credential(settings: C2paSettings | None = None, development: DevelopmentCa | None = None,
                         now: datetime | None = None) -> C2paCredential:
    """The credential ``settings`` name, checked: a production chain and key (with named trust anchors), or
    (no chain set) the deployment's development CA. Raises ``C2paCredentialError`` for anything unusable."""
    settings = settings or C2paSettings()
    now = now or datetime.now(UTC)
    if settings.cert_chain is not None:
        if settings.trust_anchors is None:
            raise C2paCredentialError(
                "a production C2PA chain needs PROVMARK_C2PA_TRUST_ANCHORS: the roots verifiers trust (the "
                "chain's own root is not assumed to be one)")
        chain = _read_certificates(settings.cert_chain)
        key = _read_private_key(settings.private_key)
        anchors = to_pem(*_read_certificates(settings.trust_anchors))
        return _checked(chain, key, anchors, settings.tsa_url, now, "production", str(settings.cert_chain))
    if development is None:
        raise C2paCredentialError("no C2PA credential: the deployment has no development CA and no chain is set")
    root = _parse_certificates(development.root_pem, "the development root")[0]
    leaf = _parse_certificates(development.signer_pem, "the development signing certificate")[0]
    anchors = to_pem(*_read_certificates(settings.trust_anchors)) if settings.trust_anchors else to_pem(root)
    return _checked([leaf], development.signer_key, anchors, settings.tsa_url, now, "development",
                    "the development CA")


def configured_trust_anchors(settings: C2paSettings) -> str | None:
    """The PEM roots ``settings`` name for readers (PROVMARK_C2PA_TRUST_ANCHORS), or None when unset."""
    return to_pem(*_read_certificates(settings.trust_anchors)) if settings.trust_anchors is not None else None


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
    return _parse_certificates(data, str(path))


def _parse_certificates(data: bytes | str, what: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(data.encode() if isinstance(data, str) else data)
    except ValueError as error:
        raise C2paCredentialError(f"{what} is not a PEM certificate file") from error


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


def _current(leaf: x509.Certificate, root: x509.Certificate, key: SigningKey, now: datetime) -> bool:
    """Whether the stored signing certificate is still the one to use (else it is re-issued)."""
    try:
        leaf.verify_directly_issued_by(root)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return (public_key_der(leaf.public_key()) == public_key_der(key)
            and leaf.not_valid_after_utc - now >= RENEW_BEFORE)
