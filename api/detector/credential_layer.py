"""The detector's second layer: the C2PA Content Credentials a pasted text carries or comes with.

``credentials_of`` reads them (``provenance.c2pa_reading``): None, at the cost of one scan for U+FEFF,
when the text has no embedded manifest and none was given. ``credential_layer`` states them beside the
watermark verdict: valid, trusted (under this service's C2PA trust anchors), whether the text still
matches the signed hash, and whether the manifest's soft binding names the watermark the verdict found.
"""

from __future__ import annotations

import base64
import binascii

from api.http import ApiError
from provenance.c2pa_reading import CredentialReport, read_credentials
from provenance.identity import IdentityError


def trust_anchors(services) -> str:
    """The PEM roots a manifest must chain to: ``PROVMARK_C2PA_TRUST_ANCHORS``, else the deployment's
    development root (``api.provenance_keys.PublicKeys``); none before the deployment has an identity."""
    try:
        return services.public_keys.trust_anchors()
    except IdentityError:
        return ""


def credentials_of(services, text: str, manifest_b64: str | None) -> CredentialReport | None:
    """The report on ``text``'s credentials (``manifest_b64``: a detached store, base64); 422 when that is not
    base64."""
    store = None
    if manifest_b64 is not None:
        try:
            store = base64.b64decode(manifest_b64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "invalid_fields", "invalid fields: manifest (not base64)",
                           details=[{"field": "manifest", "message": "not base64"}]) from None
    if store is None and "\ufeff" not in text:
        return None  # the common case, before any trust anchor is loaded
    return read_credentials(text, store, trust_anchors(services))


def credential_layer(report: CredentialReport | None, verdict) -> dict | None:
    """The report as the verdict states it, with ``soft_binding_agrees``: the manifest's watermark (key and
    spec fingerprint) is the one the verdict found watermarked (None when the manifest names none, or the text is
    too short for a verdict either way)."""
    if report is None:
        return None
    layer = report.to_dict()
    binding = report.soft_binding
    agrees = None
    if binding is not None and binding.key_id is not None and verdict.verdict != "insufficient_text":
        agrees = (verdict.verdict == "watermarked" and verdict.key_id == binding.key_id
                  and verdict.fingerprint == binding.spec_fingerprint)
    layer["soft_binding_agrees"] = agrees
    return layer
