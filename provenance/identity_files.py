"""The key files a single-machine home kept before its identity moved to the shared store, read once to adopt
them (so its receipts, log heads and manifests keep verifying), and compared at every start afterwards (a
replica whose home holds other keys than the deployment's refuses to serve).

    receipt-signing.key (+ .retired.json)   the receipt key and the public keys it replaced
    log-signing.key                         the transparency log's key
    c2pa/root.key, root.pem                 the development CA's root key and certificate
    c2pa/signer.key, chain.pem              the development signing key and its certificate
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography import x509

from provenance.identity import (
    C2PA_ROOT,
    C2PA_SIGNER,
    LOG,
    RECEIPT,
    IdentityError,
    IdentitySeal,
    KeyRecord,
    PublicIdentity,
)
from provenance.jws import ed25519_of
from provenance.sealed_key import SealedKeyError, read_sealed_document

FILES = {RECEIPT: "receipt-signing.key", LOG: "log-signing.key", C2PA_ROOT: "c2pa/root.key",
         C2PA_SIGNER: "c2pa/signer.key"}
CERTIFICATES = {C2PA_ROOT: "c2pa/root.pem", C2PA_SIGNER: "c2pa/chain.pem"}
RETIRED_SUFFIX = ".retired.json"


def _sealed_document(home: Path, role: str) -> dict | None:
    path = home / FILES[role]
    if not path.exists():
        return None
    try:
        return read_sealed_document(path)
    except SealedKeyError as error:
        raise IdentityError(str(error)) from None


def _certificate(home: Path, role: str) -> str | None:
    path = home / CERTIFICATES[role] if role in CERTIFICATES else None
    if path is None or not path.exists():
        return None
    text = path.read_text()
    try:
        x509.load_pem_x509_certificates(text.encode())
    except ValueError:
        raise IdentityError(f"{path} is not a PEM certificate") from None
    return text


def home_records(home: Path, seal: IdentitySeal, created_at: str) -> list[KeyRecord]:
    """The records of the key files ``home`` holds (none: an empty list); each must open under ``seal``."""
    records = []
    for role in FILES:
        document = _sealed_document(home, role)
        if document is None:
            continue
        if role in CERTIFICATES and _certificate(home, role) is None:
            raise IdentityError(f"{home / FILES[role]} has no {CERTIFICATES[role]} beside it")
        records.append(seal.adopted(role, document, created_at, _certificate(home, role)))
    records.extend(_retired_receipt_keys(home, seal, created_at))
    return records


def _retired_receipt_keys(home: Path, seal: IdentitySeal, created_at: str) -> list[KeyRecord]:
    path = home / (FILES[RECEIPT] + RETIRED_SUFFIX)
    if not path.exists():
        return []
    try:
        keys = json.loads(path.read_text()).get("keys", [])
        return [seal.retired(RECEIPT, ed25519_of(jwk), created_at, jwk["retired_at"]) for jwk in keys]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise IdentityError(f"{path} cannot be read as a list of retired keys ({error})") from None


def home_conflicts(home: Path, identity: PublicIdentity) -> list[str]:
    """Where ``home``'s key files hold another key than the deployment's (empty: none, or the same)."""
    problems = []
    for role, name in FILES.items():
        document = _sealed_document(home, role)
        if document is None:
            continue
        known = {r.public_key for r in identity.records if r.role == role}
        if document.get("public_key") not in known:
            problems.append(f"{home / name} holds another {role} key than the deployment's")
    return problems

