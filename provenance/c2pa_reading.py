"""Reading the C2PA Content Credentials of a text: embedded (C2PA 2.4 Annex A.8) or detached.

c2pa's Reader validates the store (signature, certificate trust, assertions, the ``c2pa.hash.data``
over the text's bytes). For the embedded form, c2pa-rs 0.91 adds one failure it cannot avoid: it does
not know A.8, so it never finds the store at the excluded range and reports
``assertion.dataHash.mismatch`` "data hash exclusion does not match the manifest location in the
asset" (while also reporting ``assertion.dataHash.match``). The rule that failure stands for (the
exclusion holds the manifest store and nothing else) is checked here the A.8 way instead: the
exclusion must be exactly the wrapper's byte range and ``c2pa_unstructured_text.verify_data_hash``
must pass. Only then is that one failure dropped and the state recomputed; ``c2pa_validation_state``
keeps what c2pa's Reader said.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
from dataclasses import asdict, dataclass

import c2pa
import c2pa_unstructured_text as a8

from provenance.c2pa_manifest import (
    ACTIONS_LABEL,
    MODEL_PARAMETER,
    PROVENANCE_LABEL,
    SOFT_BINDING_ALG_PREFIX,
    SOFT_BINDING_LABEL,
)
from provenance.c2pa_native import reading_context

EMBEDDED, DETACHED = "embedded", "detached"
WRAPPER_MARK = "\ufeff"  # every A.8 wrapper starts with U+FEFF: its absence is the free "no credentials"
UNREADABLE = "general.error"  # C2PA's code for an error no other code names
_HASH_MISMATCH = "assertion.dataHash.mismatch"
_LOCATION_RULE = "manifest location in the asset"  # c2pa-rs 0.91's explanation for the A.8 false failure
_UNTRUSTED = "signingCredential.untrusted"  # the one failure a "Valid" (not "Trusted") state keeps
_WRAPPER_PROBLEMS = {"manifest.text.corruptedWrapper": "the text's C2PA wrapper cannot be decoded",
                     "manifest.text.multipleWrappers": "the text carries more than one C2PA wrapper"}


class C2paReadError(Exception):
    """Arguments of the wrong type (a bad text or store is a report, not this)."""


@dataclass(frozen=True)
class SoftBindingInfo:
    alg: str
    key_id: str | None
    spec_fingerprint: str | None


@dataclass(frozen=True)
class ProvenanceInfo:
    receipt_id: str | None
    issuer: str | None
    detector_url: str | None


@dataclass(frozen=True)
class CredentialReport:
    """What the credentials of one text say, and whether they hold. ``visible_text`` is the text
    without its A.8 wrapper: what a watermark detector should score."""

    source: str  # "embedded" or "detached"
    manifest_id: str | None
    validation_state: str  # "Trusted", "Valid" or "Invalid" (A.8-aware, see the module docstring)
    c2pa_validation_state: str | None  # as c2pa's Reader said; None when it could not read the store
    hash_matches: bool | None
    signature_valid: bool | None
    failures: tuple[str, ...]
    visible_text: str
    model_id: str | None = None
    digital_source_type: str | None = None
    soft_binding: SoftBindingInfo | None = None
    provenance: ProvenanceInfo | None = None
    problem: str | None = None  # why no manifest could be read, if none could

    @property
    def valid(self) -> bool:
        return self.validation_state in ("Valid", "Trusted")

    @property
    def trusted(self) -> bool:
        return self.validation_state == "Trusted"

    def to_dict(self) -> dict:
        """The report as JSON-ready values (``visible_text`` left out: the caller has the text)."""
        document = asdict(self)
        del document["visible_text"]
        document["failures"] = list(self.failures)
        document.update(valid=self.valid, trusted=self.trusted)
        return document


def read_credentials(text: str, manifest_store: bytes | None = None,
                     trust_anchors: str = "") -> CredentialReport | None:
    """The credentials of ``text``: from ``manifest_store`` when given (detached), else from the A.8
    wrapper the text carries (embedded). ``None`` when there are none: no store and no wrapper; that
    answer costs one scan for U+FEFF. ``trust_anchors`` is a PEM bundle of roots ("" trusts none, so
    the best state is "Valid"). A corrupted wrapper or an unreadable store gives an "Invalid" report
    saying so; only arguments of the wrong type raise (``C2paReadError``)."""
    if not isinstance(text, str):
        raise C2paReadError("text must be a string")
    if manifest_store is None and WRAPPER_MARK not in text:
        return None
    if manifest_store is not None and not isinstance(manifest_store, bytes | bytearray | memoryview):
        raise C2paReadError("manifest_store must be bytes or None")
    if not isinstance(trust_anchors, str):
        raise C2paReadError("trust_anchors must be a PEM string")
    wrapper, wrapper_failure = _find_wrapper(text)
    visible = a8.strip(text, wrapper["start"], wrapper["length"]) if wrapper else text
    if manifest_store is not None:
        source, store = DETACHED, bytes(manifest_store)
    elif wrapper_failure is not None:
        return _unreadable(EMBEDDED, visible, wrapper_failure, _WRAPPER_PROBLEMS[wrapper_failure])
    elif wrapper is None:
        return None  # a U+FEFF that starts no wrapper
    else:
        source, store = EMBEDDED, wrapper["payload"]
    if not store:
        return _unreadable(source, visible, UNREADABLE, "the manifest store is empty")
    try:
        with c2pa.Reader("text/plain", io.BytesIO(text.encode()), manifest_data=store,
                         context=reading_context(trust_anchors)) as reader:
            detailed = json.loads(reader.detailed_json())
    except (c2pa.C2paError, ValueError):
        return _unreadable(source, visible, UNREADABLE, "the manifest store is not a readable C2PA manifest store")
    return _report(source, text, visible, wrapper, detailed)


def _find_wrapper(text: str) -> tuple[dict | None, str | None]:
    """The text's one valid A.8 wrapper, or the status code of why there is none usable."""
    try:
        return a8.extract(text), None
    except ValueError as error:
        message = str(error)
        code = "manifest.text.multipleWrappers" if "multipleWrappers" in message else "manifest.text.corruptedWrapper"
        return None, code


def _unreadable(source: str, visible: str, code: str, problem: str) -> CredentialReport:
    return CredentialReport(source=source, manifest_id=None, validation_state="Invalid", c2pa_validation_state=None,
                            hash_matches=None, signature_valid=None, failures=(code,), visible_text=visible,
                            problem=problem)


def _a8_binding_holds(text: str, wrapper: dict | None, hash_data) -> bool:
    """Whether the ``c2pa.hash.data`` excludes exactly the wrapper and its hash holds under A.8."""
    if wrapper is None or not isinstance(hash_data, dict):
        return False
    try:
        exclusions = [(int(e["start"]), int(e["length"])) for e in hash_data.get("exclusions") or []]
        if exclusions != [(wrapper["start"], wrapper["length"])]:
            return False
        a8.verify_data_hash(text, base64.b64decode(hash_data["hash"]), exclusions, hash_data.get("alg") or "sha256")
    except (ValueError, TypeError, KeyError, binascii.Error):
        return False
    return True


def _report(source: str, text: str, visible: str, wrapper: dict | None, detailed: dict) -> CredentialReport:
    manifest_id = detailed.get("active_manifest")
    manifest = (detailed.get("manifests") or {}).get(manifest_id) or {}
    assertions = manifest.get("assertion_store") or {}
    results = (detailed.get("validation_results") or {}).get("activeManifest") or {}
    failures = [f for f in results.get("failure") or [] if isinstance(f, dict)]
    success = {s.get("code") for s in results.get("success") or [] if isinstance(s, dict)}
    c2pa_state = detailed.get("validation_state")
    state = c2pa_state if c2pa_state in ("Trusted", "Valid", "Invalid") else "Invalid"
    if _a8_binding_holds(text, wrapper, assertions.get("c2pa.hash.data")):
        failures = [f for f in failures if not (f.get("code") == _HASH_MISMATCH
                                                and _LOCATION_RULE in str(f.get("explanation")))]
        if any(f.get("code") != _UNTRUSTED for f in failures):
            state = "Invalid"
        else:
            state = "Trusted" if "signingCredential.trusted" in success else "Valid"
    codes = tuple(str(f.get("code")) for f in failures)
    hash_matches = "assertion.dataHash.match" in success and _HASH_MISMATCH not in codes
    signature_valid = (False if any(c.startswith("claimSignature.") for c in codes)
                       else True if "claimSignature.validated" in success else None)
    action = _first_action(assertions.get(ACTIONS_LABEL))
    parameters = action.get("parameters") if isinstance(action.get("parameters"), dict) else {}
    provenance = assertions.get(PROVENANCE_LABEL)
    return CredentialReport(
        source=source, manifest_id=manifest_id if isinstance(manifest_id, str) else None,
        validation_state=state, c2pa_validation_state=c2pa_state, hash_matches=hash_matches,
        signature_valid=signature_valid, failures=codes, visible_text=visible,
        model_id=_string(parameters, MODEL_PARAMETER) or _string(provenance, "model_id"),
        digital_source_type=_string(action, "digitalSourceType"),
        soft_binding=_soft_binding(assertions.get(SOFT_BINDING_LABEL)),
        provenance=(ProvenanceInfo(_string(provenance, "receipt_id"), _string(provenance, "issuer"),
                                   _string(provenance, "detector_url")) if isinstance(provenance, dict) else None))


def _string(mapping, key: str) -> str | None:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    return value if isinstance(value, str) else None


def _first_action(actions_assertion) -> dict:
    actions = actions_assertion.get("actions") if isinstance(actions_assertion, dict) else None
    return actions[0] if isinstance(actions, list) and actions and isinstance(actions[0], dict) else {}


def _soft_binding(assertion) -> SoftBindingInfo | None:
    alg = _string(assertion, "alg")
    if alg is None:
        return None
    blocks = assertion.get("blocks")
    value = _string(blocks[0], "value") if isinstance(blocks, list) and blocks else None
    document = {}
    if alg.startswith(SOFT_BINDING_ALG_PREFIX) and value is not None:
        try:
            document = json.loads(base64.b64decode(value, validate=True))
        except (ValueError, binascii.Error):
            document = {}
    return SoftBindingInfo(alg, _string(document, "key_id"), _string(document, "spec_fingerprint"))
