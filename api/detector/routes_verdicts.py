"""GET /v1/verdicts (filters, cursor pages, CSV export) and GET /v1/verdicts/<id>; scope ``audit``.

A token that also holds ``explain`` reads rows whole; ``audit`` alone reads the detect-scope view each row
recorded, and the ``verdict``, ``min_z`` and ``key_id`` filters act on that view (``db.verdicts``).
"""

from __future__ import annotations

import itertools

from flask import Blueprint, Response, g, jsonify, request, stream_with_context

from api.detector.schemas import VerdictItem, VerdictList, VerdictQuery
from api.http import ApiError, ErrorResponse, parse_query
from detector.disclosure import EXPLAIN_SCOPE

CSV_MEDIA_TYPE = "text/csv"


def reads_exact() -> bool:
    """Whether this request's token is trusted with exact numbers (``explain``, or ``admin``)."""
    return g.token.allows(EXPLAIN_SCOPE)


def blueprint(api, services) -> Blueprint:
    bp = Blueprint("verdicts", __name__)
    store = services.store

    @api.route(bp, "/v1/verdicts", methods=["GET"], summary="List stored verdicts (JSON pages or CSV)",
               query=VerdictQuery, responses={200: VerdictList}, scope="audit", tags=["verdicts"])
    @services.auth.require("audit")
    def list_verdicts():
        query: VerdictQuery = parse_query(VerdictQuery)
        if _wants_csv(query):
            return _csv_response(store, query)
        try:
            page = store.list_verdicts(query.filters(), cursor=query.cursor, limit=query.limit,
                                      exact=reads_exact())
        except ValueError as error:  # only the cursor can still be malformed here
            raise ApiError(422, "invalid_fields", "invalid fields: cursor",
                           details=[{"field": "cursor", "message": str(error)}]) from None
        return jsonify({"items": page.items, "next_cursor": page.next_cursor})

    @api.route(bp, "/v1/verdicts/<verdict_id>", methods=["GET"], summary="One stored verdict",
               responses={200: VerdictItem, 404: ErrorResponse},
               scope="audit", tags=["verdicts"])
    @services.auth.require("audit")
    def get_verdict(verdict_id: str):
        found = store.get_verdict(verdict_id, exact=reads_exact())
        if found is None:
            raise ApiError(404, "verdict_not_found", "no verdict with this id")
        return jsonify(found)

    return bp


def _wants_csv(query: VerdictQuery) -> bool:
    if query.format is not None:
        return query.format == "csv"
    accept = request.accept_mimetypes
    return accept.quality(CSV_MEDIA_TYPE) > accept.quality("application/json") and \
        accept.best_match(["application/json", CSV_MEDIA_TYPE]) == CSV_MEDIA_TYPE


def _csv_response(store, query: VerdictQuery) -> Response:
    """The header and the first page are read before answering, so a database error is a clean 503."""
    lines = store.verdicts_csv(query.filters(), limit=query.limit, exact=reads_exact())
    first = list(itertools.islice(lines, 2))  # the header, then the first row (runs the first query)
    body = stream_with_context(itertools.chain(first, lines))
    response = Response(body, mimetype=CSV_MEDIA_TYPE)
    response.headers["Content-Disposition"] = 'attachment; filename="verdicts.csv"'
    return response
