"""The transparency log's public key in the forms it is published in, and reading any of them back.

    JWK           {"kty": "OKP", "crv": "Ed25519", "x": base64url(raw key), "kid", "alg": "EdDSA", "use": "sig"}
    key id        the JWK's RFC 7638 thumbprint: base64url (no padding) of SHA-256 of
                  {"crv":"Ed25519","kty":"OKP","x":"..."} (exactly those members, sorted, no whitespace)
    log id        base64 SHA-256 of the key's DER SubjectPublicKeyInfo (RFC 6962's LogID)
    PEM           SubjectPublicKeyInfo
    verifier key  the C2SP signed-note form: <name>+<8 hex digits of the key hash>+<base64(0x01 || raw key)>,
                  key hash = first 4 bytes of SHA-256(name || "\\n" || 0x01 || raw key)

``read_public_key`` accepts any of them (or a JWKS, or the service's /v1/log/public-key document).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

ED25519_NOTE_ALGORITHM = b"\x01"  # the signed-note signature type byte of Ed25519
NOTE_KEY_HASH_BYTES = 4


class LogKeyError(ValueError):
    """A value that is not an Ed25519 log public key in any accepted form."""


def raw_key(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwk_thumbprint(public_key: Ed25519PublicKey) -> str:
    """RFC 7638 thumbprint (SHA-256, base64url): the log key's ``kid`` and every head's ``key_id``."""
    members = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": b64url(raw_key(public_key))},
                         sort_keys=True, separators=(",", ":"))
    return b64url(hashlib.sha256(members.encode()).digest())


def public_jwk(public_key: Ed25519PublicKey) -> dict:
    """The key as a JWK (RFC 8037 OKP), ``kid`` its thumbprint."""
    return {"kty": "OKP", "crv": "Ed25519", "x": b64url(raw_key(public_key)), "kid": jwk_thumbprint(public_key),
            "alg": "EdDSA", "use": "sig"}


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def log_id(public_key: Ed25519PublicKey) -> str:
    """base64 SHA-256 of the DER SubjectPublicKeyInfo (the LogID of RFC 6962 §3.2)."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def note_key_hash(name: str, public_key: Ed25519PublicKey) -> bytes:
    """The signed-note key hash: SHA-256(name || "\\n" || 0x01 || raw key)[:4]."""
    digest = hashlib.sha256(name.encode() + b"\n" + ED25519_NOTE_ALGORITHM + raw_key(public_key)).digest()
    return digest[:NOTE_KEY_HASH_BYTES]


def verifier_key(name: str, public_key: Ed25519PublicKey) -> str:
    """``<name>+<hex key hash>+<base64(0x01 || raw key)>``: what note verifiers (e.g. Go's sumdb/note) take."""
    encoded = base64.b64encode(ED25519_NOTE_ALGORITHM + raw_key(public_key)).decode()
    return f"{name}+{note_key_hash(name, public_key).hex()}+{encoded}"


def parse_verifier_key(text: str) -> tuple[str, Ed25519PublicKey]:
    """(name, key) of a verifier key string; LogKeyError if malformed or its key hash does not match."""
    name, _, rest = text.strip().partition("+")  # a name has no '+'; the base64 key may
    hash_hex, _, rest = rest.partition("+")
    try:
        blob = base64.b64decode(rest, validate=True)
        key_hash = bytes.fromhex(hash_hex)
    except (ValueError, binascii.Error):
        raise LogKeyError("not a verifier key (name+hexhash+base64key)") from None
    if not name or len(blob) != 33 or blob[:1] != ED25519_NOTE_ALGORITHM:
        raise LogKeyError("the verifier key is not an Ed25519 note key")
    key = Ed25519PublicKey.from_public_bytes(blob[1:])
    if note_key_hash(name, key) != key_hash:
        raise LogKeyError("the verifier key's hash does not match its name and key")
    return name, key


def key_from_jwk(jwk: dict) -> Ed25519PublicKey:
    if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise LogKeyError("the JWK is not an Ed25519 (OKP) key")
    try:
        raw = base64.urlsafe_b64decode(str(jwk["x"]) + "=" * (-len(str(jwk["x"])) % 4))
        return Ed25519PublicKey.from_public_bytes(raw)
    except (KeyError, ValueError, binascii.Error):
        raise LogKeyError("the JWK's x is not a 32-byte Ed25519 key") from None


def read_public_key(text: str, key_id: str | None = None) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM, raw base64 (32 bytes), a verifier key, a JWK, a JWKS, or the
    /v1/log/public-key document. In a JWKS with several keys, the one whose ``kid`` is ``key_id``."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode())
        except ValueError:
            raise LogKeyError("the PEM text is not a public key") from None
        if not isinstance(key, Ed25519PublicKey):
            raise LogKeyError("the PEM public key is not an Ed25519 key")
        return key
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            raise LogKeyError("the key text starts with { but is not JSON") from None
        return _key_from_document(document, key_id)
    if text.count("+") >= 2 and not text.endswith("="):  # raw 32-byte base64 ends in "=", a verifier key never
        return parse_verifier_key(text)[1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        raise LogKeyError("not a PEM, base64, JWK, JWKS or verifier key") from None
    if len(raw) != 32:
        raise LogKeyError(f"a raw Ed25519 public key is 32 bytes, this base64 holds {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def _key_from_document(document, key_id: str | None) -> Ed25519PublicKey:
    if isinstance(document, dict) and isinstance(document.get("jwk"), dict):  # the service's public-key document
        document = document["jwk"]
    if isinstance(document, dict) and isinstance(document.get("keys"), list):
        keys = [k for k in document["keys"] if isinstance(k, dict) and k.get("kty") == "OKP"
                and k.get("crv") == "Ed25519"]
        chosen = [k for k in keys if key_id is not None and k.get("kid") == key_id] or \
            (keys if len(keys) == 1 else [])  # a lone key is tried; a wrong one fails on the head's key id
        if not chosen:
            raise LogKeyError(f"the JWKS has no Ed25519 key with kid {key_id!r}" if key_id
                              else "the JWKS holds several Ed25519 keys: say which by the head's key id")
        document = chosen[0]
    return key_from_jwk(document)
