"""Signing C2PA Content Credentials for generated text (C2PA 2.4), detached or embedded (Annex A.8).

A manifest says: created by provmark (``c2pa.actions.v2``: one ``c2pa.created`` action, digital source
type trainedAlgorithmicMedia, softwareAgent provmark, the model in the action's parameters); how the
text is watermarked (``c2pa.soft-binding``, when it is); and where to check it
(``org.provmark.provenance``: the receipt id, the issuer and the detector's address). Its hard binding
is a ``c2pa.hash.data`` over the text's UTF-8 bytes:

* detached: the text exactly as delivered, no exclusions; the store travels beside it (a .c2pa file);
* embedded: the text NFC-normalised, then the A.8 wrapper (U+FEFF and a variation-selector run, padded
  to ``target_length`` of the store size) appended; the hash excludes the wrapper's byte range.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import json
import re
import unicodedata
import uuid
from dataclasses import dataclass

import c2pa
import c2pa_unstructured_text as a8

from provenance.c2pa_credential import C2paCredential
from provenance.c2pa_native import C2paNativeError, hashed_placeholder_size, new_builder, sign_data_hashed, signer_for

ACTIONS_LABEL = "c2pa.actions.v2"
SOFT_BINDING_LABEL = "c2pa.soft-binding"
PROVENANCE_LABEL = "org.provmark.provenance"
MODEL_PARAMETER = "org.provmark.model"
TRAINED_ALGORITHMIC_MEDIA = "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
SOFT_BINDING_ALG_PREFIX = "org.provmark.watermark."  # provisional: not in the C2PA soft-binding registry
SOFT_BINDING_NAME = "provmark token-sampling watermark"
HASH_NAME = "jumbf manifest"
MAX_FIELD_CHARS = 512
_FAMILY_RE = re.compile(r"[a-z][a-z0-9-]{0,31}")


class C2paSigningError(Exception):
    """Claims or text that cannot be signed, or a refusal by c2pa-rs. Never contains key material."""


@dataclass(frozen=True)
class WatermarkClaim:
    """The watermark a text carries: its family (kgw, gumbel, synthid, ...), spec string, spec
    fingerprint and key id."""

    family: str
    spec: str
    spec_fingerprint: str
    key_id: str


@dataclass(frozen=True)
class TextClaims:
    """What a manifest states about one generated text."""

    model_id: str
    receipt_id: str
    issuer: str
    detector_url: str
    watermark: WatermarkClaim | None = None
    title: str = "Generated text"


@dataclass(frozen=True)
class SignedText:
    """A signed text: the active manifest's label (``urn:c2pa:...``), the JUMBF manifest store, the text
    to deliver, and the byte range the hash leaves out (``None`` when detached)."""

    manifest_id: str
    manifest_store: bytes
    text: str
    embedded: bool
    exclusion: tuple[int, int] | None


@functools.cache  # importlib.metadata scans the installed distributions: 0.6 ms a call
def provmark_version() -> str:
    try:
        return importlib.metadata.version("provmark")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def soft_binding_alg(family: str) -> str:
    """The provisional soft-binding algorithm name of a watermark family, e.g. org.provmark.watermark.kgw.1."""
    return f"{SOFT_BINDING_ALG_PREFIX}{family}.1"


def soft_binding_value(key_id: str, spec_fingerprint: str) -> str:
    """The block value: base64 of the canonical JSON {"key_id", "spec_fingerprint"}."""
    document = {"key_id": key_id, "spec_fingerprint": spec_fingerprint}
    return base64.b64encode(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).decode()


def _text_field(name: str, value) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_FIELD_CHARS or not value.isprintable():
        raise C2paSigningError(f"{name} must be a printable string of 1 to {MAX_FIELD_CHARS} characters")
    return value


def _check_claims(claims: TextClaims) -> None:
    if not isinstance(claims, TextClaims):
        raise C2paSigningError("claims must be a TextClaims")
    for name in ("model_id", "receipt_id", "issuer", "detector_url", "title"):
        _text_field(name, getattr(claims, name))
    mark = claims.watermark
    if mark is not None:
        if not isinstance(mark, WatermarkClaim):
            raise C2paSigningError("watermark must be a WatermarkClaim or None")
        for name in ("spec", "spec_fingerprint", "key_id"):
            _text_field(f"watermark.{name}", getattr(mark, name))
        if not isinstance(mark.family, str) or not _FAMILY_RE.fullmatch(mark.family):
            raise C2paSigningError("watermark.family must be a short lowercase name such as 'kgw'")


def manifest_definition(claims: TextClaims, label: str) -> dict:
    """The c2pa Builder definition of a manifest for ``claims`` (see the module docstring)."""
    version = provmark_version()
    action = {"action": "c2pa.created", "digitalSourceType": TRAINED_ALGORITHMIC_MEDIA,
              "softwareAgent": {"name": "provmark", "version": version},
              "parameters": {"description": f"Text generated by the language model {claims.model_id}",
                             MODEL_PARAMETER: claims.model_id}}
    assertions = [{"label": ACTIONS_LABEL, "data": {"actions": [action]}}]
    if claims.watermark is not None:
        mark = claims.watermark
        # value is a CBOR text string here: the Builder's JSON path has no byte-string type
        assertions.append({"label": SOFT_BINDING_LABEL, "data": {
            "alg": soft_binding_alg(mark.family), "name": SOFT_BINDING_NAME,
            "blocks": [{"scope": {}, "value": soft_binding_value(mark.key_id, mark.spec_fingerprint)}]}})
    provenance = {"receipt_id": claims.receipt_id, "issuer": claims.issuer, "detector_url": claims.detector_url,
                  "model_id": claims.model_id}
    if claims.watermark is not None:
        provenance["watermark_spec"] = claims.watermark.spec
    assertions.append({"label": PROVENANCE_LABEL, "data": provenance})
    return {"label": label, "claim_generator_info": [{"name": "provmark", "version": version}],
            "title": claims.title, "format": "text/plain", "assertions": assertions}


def sign_text(credential: C2paCredential, text: str, claims: TextClaims, embedded: bool = False) -> SignedText:
    """Sign ``text`` with ``credential``: a manifest stating ``claims``, bound to the text by a
    ``c2pa.hash.data``. Detached: the text is returned unchanged and the store is its sidecar.
    Embedded: the returned text is NFC(text) plus the A.8 wrapper carrying the store, and the store is
    the same bytes the wrapper carries. Raises ``C2paSigningError`` for bad claims or text (empty, or
    already carrying a wrapper when embedding) and when c2pa-rs refuses to sign."""
    if not isinstance(text, str) or not text:
        raise C2paSigningError("text must be a non-empty string")
    _check_claims(claims)
    body = unicodedata.normalize("NFC", text) if embedded else text
    if embedded and a8.locate_all(body):
        raise C2paSigningError("the text already carries a C2PA text wrapper")
    label = f"urn:c2pa:{uuid.uuid4()}"
    try:
        builder = new_builder(credential, manifest_definition(claims, label))
        signer = signer_for(credential)
        store_size = hashed_placeholder_size(builder, signer)
        data = body.encode()
        exclusion = (len(data), a8.target_length(store_size)) if embedded else None
        data_hash = {"exclusions": [{"start": exclusion[0], "length": exclusion[1]}] if exclusion else [],
                     "name": HASH_NAME, "alg": "sha256", "hash": list(hashlib.sha256(data).digest()), "pad": []}
        store = sign_data_hashed(builder, signer, data_hash)
    except (C2paNativeError, c2pa.C2paError) as error:
        raise C2paSigningError(f"c2pa refused to sign: {error}") from error
    if not embedded:
        return SignedText(label, store, text, False, None)
    if len(store) != store_size:
        raise C2paSigningError(f"the signed store has {len(store)} bytes, not the {store_size} reserved")
    wrapper = a8.encode_padded(store)
    if len(wrapper.encode()) != exclusion[1]:
        raise C2paSigningError("the A.8 wrapper does not have its target length")
    return SignedText(label, store, body + wrapper, True, exclusion)
