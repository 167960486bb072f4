"""Receipts as JWS that any JOSE library verifies, and the JWKS that names their keys.

A receipt is a compact JWS (RFC 7515) whose payload is a JSON claims set (a JWT, RFC 7519):

    protected header  {"alg": "Ed25519", "kid": <RFC 7638 thumbprint of the key>, "typ": "provmark-receipt+jwt"}
    payload           {"iss", "iat", "jti", ...the receipt's fields}

``alg: Ed25519`` is the fully specified algorithm name of RFC 9864 (not the older polymorphic
``EdDSA``). A verifier picks the key by ``kid`` from the issuer's JWKS (``/.well-known/jwks.json``),
which lists the current key and every retired one, so receipts signed before a rotation still verify.
joserfc (the JOSE library used here) refuses ``Ed25519`` unless it is named explicitly, which is also
what a careful verifier does: the algorithm is pinned, never taken from the token alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import KeySet, OKPKey

JWS_ALG = "Ed25519"
RECEIPT_TYP = "provmark-receipt+jwt"
MAX_TOKEN_CHARS = 16_384  # a receipt is about 1 KB; anything far larger is not one


class JwsError(Exception):
    """A receipt that does not verify, or a JWKS that cannot be used; the message says which check failed."""


def okp_key(key: Ed25519PublicKey | Ed25519PrivateKey) -> OKPKey:
    return OKPKey.import_key(key)


def key_id(public_key: Ed25519PublicKey) -> str:
    """The RFC 7638 JWK thumbprint (SHA-256, base64url): the ``kid`` of the key's receipts."""
    return okp_key(public_key).thumbprint()


def public_jwk(public_key: Ed25519PublicKey, **members) -> dict:
    """The public JWK of an Ed25519 key, with ``kid``, ``alg`` and ``use``; ``members`` add to it."""
    jwk = okp_key(public_key).as_dict(private=False)
    return {**jwk, "kid": key_id(public_key), "alg": JWS_ALG, "use": "sig", **members}


def sign_compact(private_key: Ed25519PrivateKey, claims: dict, typ: str = RECEIPT_TYP) -> str:
    """A compact JWS over the JSON of ``claims`` (sorted keys, no whitespace), kid from the key."""
    header = {"alg": JWS_ALG, "kid": key_id(private_key.public_key()), "typ": typ}
    payload = json.dumps(claims, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return jws.serialize_compact(header, payload, okp_key(private_key), algorithms=[JWS_ALG])


@dataclass(slots=True, frozen=True)
class VerifiedJws:
    header: dict
    claims: dict


def verify_compact(token: str, jwks: dict, typ: str = RECEIPT_TYP) -> VerifiedJws:
    """Check ``token`` against the key its ``kid`` names in ``jwks``; the claims if every check passes.

    Raises JwsError naming the failed check: not a compact JWS, another algorithm or type, a kid the
    JWKS does not list, a bad signature, or a payload that is not a JSON object.
    """
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN_CHARS or token.count(".") != 2:
        raise JwsError("not a compact JWS (three base64url parts separated by dots)")
    keys = _key_set(jwks)
    try:
        header = jws.extract_compact(token.encode("ascii")).headers()
    except (JoseError, ValueError, UnicodeError) as error:
        raise JwsError(f"not a compact JWS: {error}") from None
    if header.get("alg") != JWS_ALG:
        raise JwsError(f"the JWS algorithm is {header.get('alg')!r}, not {JWS_ALG!r}")
    if header.get("typ") != typ:
        raise JwsError(f"the JWS type is {header.get('typ')!r}, not {typ!r}")
    kid = header.get("kid")
    if not any(key.get("kid") == kid for key in jwks.get("keys", [])):
        raise JwsError(f"the key {kid!r} is not in the JWKS")
    try:
        verified = jws.deserialize_compact(token, keys, algorithms=[JWS_ALG])
    except JoseError as error:
        raise JwsError(f"the signature does not verify with key {kid!r} ({error.error})") from None
    try:
        claims = json.loads(verified.payload)
    except (ValueError, UnicodeError):
        raise JwsError("the payload is not JSON") from None
    if not isinstance(claims, dict):
        raise JwsError("the payload is not a JSON object")
    return VerifiedJws(header=dict(header), claims=claims)


def _key_set(jwks: dict) -> KeySet:
    if not isinstance(jwks, dict) or not isinstance(jwks.get("keys"), list):
        raise JwsError('a JWKS is a JSON object with a "keys" list')
    usable = [key for key in jwks["keys"] if isinstance(key, dict) and key.get("kty") == "OKP"
              and key.get("crv") == "Ed25519" and isinstance(key.get("kid"), str)]
    try:
        return KeySet.import_key_set({"keys": [{name: key[name] for name in ("kty", "crv", "x", "kid")}
                                              for key in usable]})
    except (JoseError, KeyError, ValueError) as error:
        raise JwsError(f"the JWKS holds a key that cannot be read ({error})") from None


def ed25519_of(jwk: dict) -> Ed25519PublicKey:
    """The Ed25519 public key of one JWK (for the legacy receipts, signed over canonical JSON)."""
    try:
        key = OKPKey.import_key({name: jwk[name] for name in ("kty", "crv", "x")})
    except (JoseError, KeyError, ValueError, TypeError) as error:
        raise JwsError(f"not an Ed25519 JWK ({error})") from None
    public = key.public_key
    if not isinstance(public, Ed25519PublicKey):
        raise JwsError("not an Ed25519 JWK")
    return public
