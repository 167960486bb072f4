"""What the generation service issues with every finished text: the C2PA manifest and the JWS receipt.

A request's ``c2pa`` field says how the manifest travels (``C2PA_MODES``): ``detached`` (default: stored,
answered by id and URL), ``inline`` (also its bytes, base64, in the answer), ``embedded`` (inside the text
itself, C2PA 2.4 Annex A.8: the answer's text carries it) or ``off``. The manifest names the receipt id,
and the receipt's JWS names the manifest id: the identifier the layers cross-reference. Both are stored,
with their audit events, in one transaction (``db.receipts.store_receipt``).
"""

from __future__ import annotations

import base64
import unicodedata
from dataclasses import dataclass, replace

from db.manifests import ManifestRecord
from db.receipts import ReceiptLinks, ReceiptSigner, issue_receipt
from db.rows import text_sha256
from db.store import Store
from provenance.c2pa_credential import C2paCredential
from provenance.c2pa_manifest import TextClaims, WatermarkClaim, sign_text, soft_binding_alg, soft_binding_value

C2PA_MODES = ("detached", "inline", "embedded", "off")
DEFAULT_C2PA_MODE = "detached"
MANIFESTS_PATH = "/v1/manifests/"  # the detector's Soft Binding Resolution API serves stored manifests there
NO_KEY_ID = "none"  # receipt key id of a generation no keyring key marked (placeholder: receipts need one)
UNWATERMARKED_FINGERPRINT = "unwatermarked"  # receipt spec fingerprint when there is no watermark


@dataclass(slots=True, frozen=True)
class Issued:
    """A finished text's credentials: the receipt, the ``c2pa`` answer field (None when off), the text as
    delivered (with its A.8 wrapper when embedded) and what streaming appends to the streamed text."""

    receipt: dict
    c2pa: dict | None
    text: str
    stream_suffix: str


class Credentials:
    """Signs and stores a finished text's manifest and receipt (one per app)."""

    def __init__(self, store: Store, signer: ReceiptSigner, c2pa_credential: C2paCredential | None, *,
                 model_id: str, links: ReceiptLinks) -> None:
        self.store = store
        self.signer = signer
        self.c2pa_credential = c2pa_credential
        self.model_id = model_id
        self.links = links

    def issue(self, out, receipt_id: str, actor: str, c2pa_mode: str = DEFAULT_C2PA_MODE) -> Issued:
        mark = out.watermark
        key_id = (mark.key_id if mark is not None else None) or NO_KEY_ID
        fingerprint = mark.fingerprint if mark is not None else UNWATERMARKED_FINGERPRINT
        embedded = c2pa_mode == "embedded" and self.c2pa_credential is not None and bool(out.text)
        visible = unicodedata.normalize("NFC", out.text) if embedded else out.text  # what an A.8 hash covers
        manifest, c2pa, text = None, None, out.text
        if c2pa_mode != "off" and self.c2pa_credential is not None and out.text:  # an empty text has nothing to sign
            claim = None
            if mark is not None and mark.key_id is not None:  # a keyed watermark: the soft binding can name it
                claim = WatermarkClaim(family=mark.family, spec=mark.spec,
                                       spec_fingerprint=mark.fingerprint, key_id=mark.key_id)
            claims = TextClaims(model_id=self.model_id, receipt_id=receipt_id, issuer=self.links.issuer,
                                detector_url=self.links.detector or "", watermark=claim)
            signed = sign_text(self.c2pa_credential, out.text, claims, embedded=embedded)
            binding = (f"{soft_binding_alg(claim.family)} {soft_binding_value(claim.key_id, claim.spec_fingerprint)}"
                       if claim is not None else None)
            manifest = ManifestRecord(signed.manifest_id, receipt_id, text_sha256(visible), signed.embedded,
                                      binding, signed.manifest_store)
            text = signed.text
            c2pa = {"manifest_id": signed.manifest_id, "embedded": signed.embedded,
                    "manifest_url": f"{self.links.detector}{MANIFESTS_PATH}{signed.manifest_id}"}
            if c2pa_mode == "inline":
                c2pa["manifest_store"] = base64.b64encode(signed.manifest_store).decode("ascii")
        links = replace(self.links, spec=mark.spec if mark is not None else None,
                        c2pa_manifest_id=manifest.manifest_id if manifest is not None else None)
        receipt = issue_receipt(self.store, self.signer, actor, manifest,
                                text_sha256=text_sha256(visible), token_count=len(out.token_ids),
                                model_id=self.model_id, spec_fingerprint=fingerprint, key_id=key_id,
                                receipt_id=receipt_id, links=links)
        suffix = text[len(visible):] if embedded else ""  # the wrapper: streamed text + suffix = the text
        return Issued(receipt, c2pa, text, suffix)
