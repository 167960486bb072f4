"""X.509 pieces of the C2PA credential: the EKU OIDs, the development CA's root and signing
certificates, and PEM helpers. Pure ``cryptography``; what is accepted or refused is decided in
``provenance.c2pa_credential``.

The signing certificate carries two EKUs:

* ``c2pa-kp-claimSigning`` (1.3.6.1.4.1.62558.2.1), C2PA's own claim-signing purpose, which the C2PA
  certificate policy names for claim signers;
* ``id-kp-emailProtection`` (1.3.6.1.5.5.7.3.4), because c2pa-rs 0.91 with default settings (c2patool,
  c2pa-python without a ``trust.trust_config``) accepts only emailProtection among signing EKUs: with
  claimSigning alone such a reader reports ``signingCredential.invalid`` ("missing required EKU").

Our own contexts (signing and reading) list claimSigning and documentSigning in ``trust.trust_config``,
so a production certificate with either of those alone is accepted too.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID, ObjectIdentifier

CLAIM_SIGNING_EKU = ObjectIdentifier("1.3.6.1.4.1.62558.2.1")  # c2pa-kp-claimSigning
DOCUMENT_SIGNING_EKU = ObjectIdentifier("1.3.6.1.5.5.7.3.36")  # id-kp-documentSigning (RFC 9336)
EMAIL_PROTECTION_EKU = ExtendedKeyUsageOID.EMAIL_PROTECTION
SIGNING_EKUS = (CLAIM_SIGNING_EKU, DOCUMENT_SIGNING_EKU, EMAIL_PROTECTION_EKU)
# what our contexts add to c2pa-rs's built-in list (emailProtection is built in)
TRUST_CONFIG_EKUS = f"{CLAIM_SIGNING_EKU.dotted_string}\n{DOCUMENT_SIGNING_EKU.dotted_string}\n"

SigningKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
_BACKDATE = timedelta(minutes=5)  # tolerates a verifier whose clock is a little behind


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "provmark")])


def _key_usage(signing: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=signing, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=not signing,
                         crl_sign=not signing, encipher_only=False, decipher_only=False)


def make_root(root_key: ed25519.Ed25519PrivateKey, now: datetime, days: int) -> x509.Certificate:
    """A self-signed CA certificate (basicConstraints CA, pathlen 0; keyCertSign, cRLSign)."""
    name = _name("provmark development C2PA root")
    return (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(root_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signing=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(root_key.public_key()), critical=False)
            .sign(root_key, None))


def make_signing_cert(root: x509.Certificate, root_key: ed25519.Ed25519PrivateKey,
                      signing_key: ed25519.Ed25519PrivateKey, now: datetime, days: int) -> x509.Certificate:
    """An end-entity certificate under ``root`` for ``signing_key``: digitalSignature (critical), the
    two EKUs of the module docstring, AKI/SKI; never valid beyond the root."""
    not_after = min(now + timedelta(days=days), root.not_valid_after_utc)
    return (x509.CertificateBuilder().subject_name(_name("provmark C2PA signer")).issuer_name(root.subject)
            .public_key(signing_key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signing=True), critical=True)
            .add_extension(x509.ExtendedKeyUsage([CLAIM_SIGNING_EKU, EMAIL_PROTECTION_EKU]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(signing_key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()),
                           critical=False)
            .sign(root_key, None))


def to_pem(*certificates: x509.Certificate) -> str:
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certificates)


def public_key_der(key) -> bytes:
    """The SubjectPublicKeyInfo DER of a public key (or of a private key's public half)."""
    if hasattr(key, "public_key"):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def is_self_signed(certificate: x509.Certificate) -> bool:
    return certificate.issuer == certificate.subject


def signing_ekus(certificate: x509.Certificate) -> list[ObjectIdentifier]:
    """The certificate's EKUs that C2PA accepts for claim signing (empty when it has none)."""
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return []
    return [oid for oid in usages if oid in SIGNING_EKUS]


def has_digital_signature(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.KeyUsage).value.digital_signature
    except x509.ExtensionNotFound:
        return False


def is_ca(certificate: x509.Certificate) -> bool:
    try:
        return certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False
