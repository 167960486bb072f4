"""The C2PA Soft Binding Resolution API for texts: from a text, or its watermark, back to its manifest.

    GET  /v1/services/supportedAlgorithms   no token; the soft-binding algorithms this service resolves
    GET  /v1/manifests/<manifest_id>         no token; a stored manifest store (application/c2pa)
    GET  /v1/matches/byBinding?alg&value     scope ``detect``; manifests whose soft binding is exactly this
    POST /v1/matches/byBinding               scope ``detect``; the same with a JSON body {alg, value}
    POST /v1/matches/byContent?alg           scope ``detect``; the body is the text (text/plain, UTF-8)

Paths and shapes follow the API's OpenAPI document published by the C2PA (its server URL ends in /v1).
``byContent`` finds, in order: the manifest the text carries (C2PA 2.4 Annex A.8), manifests of exactly this
visible text (and of its normalised form), then, when the watermark is detected, manifests whose soft
binding names the detecting key and spec. A watermark names the key, not the text, so those last share
one binding and come with a lower ``similarityScore``. For a caller with the ``explain`` scope, also the manifests of
the remembered output the text restates in other words (``paraphrase_of_own_output``, ``detector.paraphrase_match``),
scored by their similarity (100 x cosine, at most PARAPHRASE_MAX): a ``detect`` caller would otherwise hold a
similarity oracle over outputs written for others. It scores text, so it spends the caller's daily
detection budget as ``POST /v1/detect`` does. Manifest ids are random UUID URNs: fetching one needs no
token, as a C2PA remote manifest URL needs none.
"""

from __future__ import annotations

from typing import Literal

from flask import Blueprint, Response, jsonify, request
from pydantic import BaseModel, Field, StrictStr

from api.detector.credential_layer import credentials_of
from api.detector.routes_detect import charge_up_front, settle_charge
from api.detector.routes_verdicts import reads_exact
from api.http import ApiError, ErrorResponse, StrictModel, parse_body, parse_query
from api.refusals import too_large
from db.manifests import MANIFEST_MEDIA_TYPE, find_manifests, get_manifest
from db.rows import text_sha256
from detector.normalize import normalize as normalize_text
from provenance.c2pa_manifest import soft_binding_alg, soft_binding_value
from watermark.schemes import FAMILIES, family_of_text

# the keyed watermarks a manifest's soft binding can name: their families say so (SchemeFamily.soft_binding)
SUPPORTED = tuple(soft_binding_alg(family.name) for family in FAMILIES if family.soft_binding)
EXACT, WATERMARK = 100, 50  # similarityScore: the same visible text; a text under the same key and spec
PARAPHRASE_MAX = 99  # similarityScore of a paraphrase's manifests: 100 x its cosine, never that of the same text
DEFAULT_RESULTS, MAX_RESULTS = 10, 100


class Algorithm(BaseModel):
    alg: str


class SupportedAlgorithms(BaseModel):
    """The soft-binding algorithms this service resolves (provisional names: C2PA lists no token-sampling
    watermark yet)."""

    watermarks: list[Algorithm]
    fingerprints: list[Algorithm]


class Match(BaseModel):
    manifestId: str  # noqa: N815 - the C2PA API's own field names
    similarityScore: int | None = Field(None, ge=0, le=100)  # noqa: N815


class QueryResult(BaseModel):
    matches: list[Match]


SupportedAlg = Literal[SUPPORTED]  # the names above, so /openapi.json lists them and others are a 422


class BindingQuery(StrictModel):
    alg: SupportedAlg
    value: StrictStr = Field(min_length=1, max_length=1000)


class BindingParams(BindingQuery):
    maxResults: int = Field(DEFAULT_RESULTS, ge=1, le=MAX_RESULTS)  # noqa: N815


class ResultsParams(StrictModel):
    alg: SupportedAlg | None = None
    maxResults: int = Field(DEFAULT_RESULTS, ge=1, le=MAX_RESULTS)  # noqa: N815


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("resolution", __name__)
    store = services.store

    @api.route(bp, "/v1/services/supportedAlgorithms", methods=["GET"], summary="Soft-binding algorithms resolved",
               responses={200: SupportedAlgorithms}, tags=["c2pa"])
    def supported_algorithms():
        services.auth.limit_anonymous()
        return jsonify({"watermarks": [{"alg": alg} for alg in SUPPORTED], "fingerprints": []})

    @api.route(bp, "/v1/manifests/<manifest_id>", methods=["GET"], summary="A stored C2PA manifest store",
               responses={200: (MANIFEST_MEDIA_TYPE, "the manifest store (JUMBF)"), 404: ErrorResponse},
               tags=["c2pa"])
    def manifest(manifest_id: str):
        services.auth.limit_anonymous()
        record = get_manifest(store, manifest_id) if len(manifest_id) <= 100 else None
        if record is None:
            raise ApiError(404, "manifest_not_found", "no manifest with this id")
        return Response(record.manifest_store, mimetype=MANIFEST_MEDIA_TYPE,
                        headers={"Content-Disposition": 'attachment; filename="manifest.c2pa"'})

    @api.route(bp, "/v1/matches/byBinding", methods=["GET"], summary="Manifests with this soft binding",
               query=BindingParams, responses={200: QueryResult}, scope="detect", tags=["c2pa"])
    @services.auth.require("detect")
    def by_binding():
        query: BindingParams = parse_query(BindingParams)
        return jsonify({"matches": _binding_matches(store, query.alg, query.value, query.maxResults)})

    @api.route(bp, "/v1/matches/byBinding", methods=["POST"], summary="Manifests with this soft binding",
               body=BindingQuery, query=ResultsParams, responses={200: QueryResult}, scope="detect",
               tags=["c2pa"])
    @services.auth.require("detect")
    def by_large_binding():
        body: BindingQuery = parse_body(BindingQuery)
        limit = parse_query(ResultsParams).maxResults
        return jsonify({"matches": _binding_matches(store, body.alg, body.value, limit)})

    @api.route(bp, "/v1/matches/byContent", methods=["POST"], summary="Manifests of a text, found from the text",
               query=ResultsParams, responses={200: QueryResult, 413: ErrorResponse, 415: ErrorResponse},
               scope="detect", tags=["c2pa"], content_type="text/plain")
    @services.auth.require("detect")
    def by_content():
        query: ResultsParams = parse_query(ResultsParams)
        text = _text_body(services.settings.max_text_chars)
        if not text.strip():
            return jsonify({"matches": []})  # nothing to match, and nothing to spend the budget on
        charged = charge_up_front(services, text)  # before any work on the text
        report = credentials_of(services, text, None)
        visible = report.visible_text if report is not None else text
        matches = _Matches(query.maxResults)
        if report is not None and report.manifest_id is not None and get_manifest(store, report.manifest_id):
            matches.add(report.manifest_id, EXACT)
        for sha in dict.fromkeys((text_sha256(visible), text_sha256(normalize_text(visible).text))):
            for record in find_manifests(store, text_sha256=sha, limit=query.maxResults):
                matches.add(record.manifest_id, EXACT)
        with services.detect_lock:
            verdict = services.detector.detect(visible)
        settle_charge(services, charged, verdict.num_tokens)
        paraphrase = verdict.paraphrase_of_own_output
        if reads_exact() and paraphrase is not None and paraphrase["matched"]:  # explain and admin only
            score = min(PARAPHRASE_MAX, max(1, round(100 * paraphrase["similarity"])))
            for record in find_manifests(store, receipt_id=paraphrase["receipt_id"], limit=query.maxResults):
                matches.add(record.manifest_id, score)
        if verdict.verdict == "watermarked" and verdict.key_id is not None:
            family = family_of_text(verdict.watermark).name
            if query.alg in (None, soft_binding_alg(family)):
                binding = f"{soft_binding_alg(family)} {soft_binding_value(verdict.key_id, verdict.fingerprint)}"
                for record in find_manifests(store, soft_binding=binding, limit=query.maxResults):
                    matches.add(record.manifest_id, WATERMARK)
        return jsonify({"matches": matches.items})

    return bp


class _Matches:
    """Matches in the order found, each manifest once, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit, self.items, self._seen = limit, [], set()

    def add(self, manifest_id: str, score: int) -> None:
        if manifest_id not in self._seen and len(self.items) < self.limit:
            self._seen.add(manifest_id)
            self.items.append({"manifestId": manifest_id, "similarityScore": score})


def _binding_matches(store, alg: str, value: str, limit: int) -> list[dict]:
    return [{"manifestId": record.manifest_id} for record in
            find_manifests(store, soft_binding=f"{alg} {value}", limit=limit)]


def _text_body(limit: int) -> str:
    """The request body as UTF-8 text: 415 for another media type, 400 for bytes that are not UTF-8, 413 past
    the size limit."""
    if request.mimetype not in ("text/plain", ""):
        raise ApiError(415, "unsupported_media_type", "send the text as text/plain (UTF-8)")
    try:
        text = request.get_data(cache=True).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_text", "the body is not UTF-8 text") from None
    if len(text) > limit:
        raise too_large("text", f"text has {len(text)} characters; the limit is {limit}", limit,
                        formerly="text_too_large")
    return text
