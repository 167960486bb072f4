"""POST /v1/detect: score a text, store the verdict (with its audit event) and link any receipt.

Two layers: a text that carries a C2PA manifest (embedded, C2PA 2.4 Annex A.8) or comes with its manifest
store (``manifest``) gets ``credentials`` beside the watermark verdict (``api.detector.credential_layer``);
the watermark is scored on the visible text, the wrapper removed, so stripping a manifest changes nothing
in the watermark verdict.

Provenance: the receipt store is searched for the SHA-256 of the text exactly as received; when
that finds nothing and normalisation is on, for the SHA-256 of the normalised text (the same
normalisation the scorer applies: invisible characters, NFKC, homoglyphs, whitespace), so a
generated text that picked up zero-width characters or look-alike letters on its way still links
to its receipt. ``provenance.match`` says which (``exact`` or ``normalized``).

Scores kept: the verdict row stores the whole-text numbers and the window report, never the
per-token explanation (it reveals green lists to anyone with the audit scope).

Scores shown: a token with the ``explain`` scope (or ``admin``) gets the whole verdict; a ``detect``
token gets the verdict and a coarse, dithered p-value, no counts (``detector.disclosure``), and the
row records the detect-scope view for every caller (``options.disclosed``: what a ``detect`` token was shown,
and what the ``audit`` scope alone reads back, ``db.verdicts``).
"""

from __future__ import annotations

import math

from flask import Blueprint, g, jsonify

from api.detector.credential_layer import credential_layer, credentials_of
from api.detector.schemas import DetectRequest, DetectResponse, Provenance
from api.http import ApiError, ErrorResponse, deprecated, parse_body
from api.refusals import too_large
from db import budget
from detector.calibration import null_record
from detector.disclosure import EXPLAIN_SCOPE, recorded, with_spec_fingerprint
from detector.normalize import normalize as normalize_text
from db.receipts import find_receipt_by_text_sha256
from db.rows import text_sha256
from db.verdicts import VerdictRecord
from watermark.config import SpecError
from watermark.specs import AnySpec, parse_spec
from watermark.key_info import KeyNotFoundError, KeySpecError, KeyringError
from detector.scoring_request import DetectOptions
from watermark.field_error import FieldError

# detect()'s ValueErrors start with the option they blame ("fpr: ...").
REQUEST_FIELDS = frozenset(DetectRequest.model_fields)


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("detect", __name__)

    @api.route(bp, "/v1/detect", methods=["POST"], summary="Score a text for a watermark and store the verdict",
               body=DetectRequest, responses={200: DetectResponse, 404: ErrorResponse, 413: ErrorResponse},
               scope="detect", tags=["detect"])
    @services.auth.require("detect")
    def detect_text():
        request_body: DetectRequest = parse_body(DetectRequest)
        if request_body.explain and not g.token.allows(EXPLAIN_SCOPE):
            raise ApiError(403, "forbidden", "explain=true needs a token with the 'explain' scope: per-token "
                                             "colours reveal part of the green lists")
        limit = services.settings.max_text_chars
        if len(request_body.text) > limit:
            raise too_large("text", f"text has {len(request_body.text)} characters; the limit is {limit}", limit,
                            formerly="text_too_large")
        spec = _parse_spec(request_body.watermark)
        charged = charge_up_front(services, request_body.text)  # before any work on the text
        report = credentials_of(services, request_body.text, request_body.manifest)
        text = report.visible_text if report is not None else request_body.text  # the watermark layer's text
        try:
            verdict = _run_detection(services, request_body, spec, text)
        except ApiError:
            settle_charge(services, charged, 0)  # refused options or keys: the minimum charge stays
            raise
        settle_charge(services, charged, verdict.num_tokens)
        provenance = _find_provenance(services.store, text, request_body.normalize)
        credentials = credential_layer(report, verdict)
        shown, coarse = verdict.views(EXPLAIN_SCOPE if g.token.allows(EXPLAIN_SCOPE) else "detect")
        record = _verdict_record(verdict, request_body, provenance, coarse, credentials)
        verdict_id = services.store.record_verdict(record, g.token.caller, text=text)
        return jsonify({"id": verdict_id, **with_spec_fingerprint(shown), "provenance": provenance,
                        "credentials": credentials})

    return bp


def charge_up_front(services, text: str) -> int | None:
    """Refuse a token over its budget (429), else charge the text's estimate (``db.budget.estimate_for``) now,
    before it is normalised, tokenized or scored, so concurrent requests see the charge while this one works;
    the charge made (None: this token is not budgeted, or the budget is off). ``settle_charge`` corrects it."""
    daily = services.settings.detect_budget
    if daily <= 0 or g.token.allows(EXPLAIN_SCOPE):  # explain holders can read colours directly
        return None
    refuse_when_over_budget(services.usage, g.token.token_id, daily)
    estimate = budget.estimate_for(text)
    services.usage.charge(g.token.caller, estimate, daily)  # batched per process (db.budget)
    return estimate


def settle_charge(services, charged: int | None, num_tokens: int) -> None:
    """Bring an up-front charge to what the detection cost (``db.budget.charge_for`` its scored tokens)."""
    if charged is None:
        return
    difference = budget.charge_for(num_tokens) - charged
    if difference:
        services.usage.charge(g.token.caller, difference, services.settings.detect_budget)


def refuse_when_over_budget(usage, token_id: str, daily_tokens: int) -> None:
    wait = usage.retry_after(token_id, daily_tokens)
    if wait > 0:
        raise ApiError(429, "detection_budget_exhausted",
                       f"this token has had its {daily_tokens} text tokens scored today (UTC); the budget resets "
                       f"at midnight UTC", headers={"Retry-After": str(wait)})


def _parse_spec(raw: str | None) -> AnySpec | None:
    """The request's spec; None when it names none (the named keys' own spec, else the default spec)."""
    if raw is None:
        return None
    try:
        return parse_spec(raw)
    except SpecError as error:
        raise ApiError(422, "invalid_fields", f"invalid fields: watermark ({error})",
                       details=[{"field": "watermark", "message": str(error)}]) from None


def _run_detection(services, body: DetectRequest, spec: AnySpec | None, text: str):
    if body.all_keys:
        deprecated("all_keys is deprecated; leave keys out to test every detection key")
    if body.all_keys and body.keys is not None:
        raise ApiError(422, "invalid_fields", "invalid fields: all_keys (give keys or all_keys=true, not both)",
                       details=[{"field": "all_keys", "message": "give either keys or all_keys=true, not both"}])
    if body.keys is not None and spec is not None and not spec.needs_key:
        raise ApiError(422, "invalid_fields", "invalid fields: keys (an hf spec is public and takes no key)",
                       details=[{"field": "keys", "message": "an hf spec is public and takes no key"}])
    try:
        with services.detect_lock:
            return services.detector.detect(
                text, keys=body.keys, spec=spec, options=DetectOptions(
                    windows=body.windows, explain=body.explain, normalize=body.normalize, dedup=body.dedup,
                    z_threshold=body.z_threshold, fpr=body.fpr, forced_positions=body.forced_positions))
    except KeyNotFoundError as error:  # keyring messages name key ids, never secrets
        raise ApiError(404, "key_not_found", str(error)) from None
    except KeySpecError as error:  # names key ids and their (public) specs
        raise ApiError(422, "spec_not_bound_to_key", str(error),
                       details=[{"field": "watermark", "message": str(error)}]) from None
    except KeyringError as error:
        raise ApiError(500, "keyring_error", f"the keyring cannot be used ({type(error).__name__})") from None
    except ValueError as error:  # a FieldError names its field; any other is the body's
        name = error.field if isinstance(error, FieldError) else None
        field = name if name in REQUEST_FIELDS else "(body)"
        raise ApiError(422, "invalid_fields", f"invalid fields: {field}",
                       details=[{"field": field, "message": str(error)}]) from None


def _find_provenance(store, text: str, try_normalized: bool) -> dict | None:
    """The receipt of this exact text, else (normalisation on) of its normalised form."""
    candidates = [("exact", text_sha256(text))]
    if try_normalized:
        normalized = normalize_text(text).text
        if normalized != text:
            candidates.append(("normalized", text_sha256(normalized)))
    for match, sha in candidates:
        receipt = find_receipt_by_text_sha256(store, sha)
        if receipt is not None:
            return Provenance(match=match, **receipt).model_dump()
    return None


def _verdict_record(verdict, body: DetectRequest, provenance: dict | None, coarse: dict,
                    credentials: dict | None) -> VerdictRecord:
    """The stored form: NaN (nothing scored) becomes 0.0 for z and the green fraction; with the detect-scope
    view (``coarse``: what a ``detect`` caller was shown, and all the ``audit`` scope alone reads back)."""
    options = body.model_dump(exclude={"text", "manifest"})
    if credentials is not None:
        options["credentials"] = credentials
    options["disclosed"] = recorded(coarse)
    options["keys_tested"] = [k["key_id"] for k in verdict.keys if k.get("key_id")]
    options["null"] = null_record(verdict)
    if verdict.statistic is not None:  # sampling specs: the scheme's own statistic (no green count)
        options["statistic"] = verdict.statistic
    if verdict.spoof_check is not None:
        options["spoof_check"] = verdict.spoof_check
    if verdict.own_output is not None:
        options["own_output"] = verdict.own_output
    if verdict.paraphrase_of_own_output is not None:
        options["paraphrase_of_own_output"] = verdict.paraphrase_of_own_output
    if verdict.public_half is not None:  # two-part keys: the published half's verdict and the paired test
        options["public_half"] = verdict.public_half
    return VerdictRecord(
        text_sha256=verdict.text_sha256,
        verdict=verdict.verdict,
        z=_finite_or_zero(verdict.z_score),
        p_value=min(1.0, max(0.0, _finite_or_zero(verdict.p_value, default=1.0))),
        green_count=int(verdict.num_green_tokens or 0),
        scored_count=int(verdict.num_tokens_scored),
        green_fraction=_finite_or_zero(verdict.green_fraction),
        spec=verdict.watermark,
        spec_fingerprint=verdict.fingerprint,
        tokenizer_fingerprint=verdict.tokenizer_fingerprint,
        key_id=verdict.key_id,
        options=options,
        windows=verdict.windows,
        receipt_id=provenance["receipt_id"] if provenance else None,
    )


def _finite_or_zero(value, default: float = 0.0) -> float:
    return float(value) if value is not None and math.isfinite(value) else default
