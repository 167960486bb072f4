"""What both Flask services share: JSON errors, typed request bodies, bearer-token auth with
scopes, per-token rate limits, and an OpenAPI document built from the same pydantic models that
validate the requests.

Request-size policy (both services; checked before a body is parsed):

    body bytes      max_text_chars * 6 + 64 KiB   from Content-Length before anything is read (413);
                                                  a chunked body: 411 under gunicorn (send a length),
                                                  cut at the limit (413) under werkzeug's server
    JSON nesting    MAX_JSON_DEPTH (32) levels    400; these APIs need 3
    strings, lists  each model's maxLength / maxItems (422 naming the field); text fields are also
                    held to max_text_chars by the routes (413)

Error bodies are always ``{"error": {"code": ..., "message": ..., "details": [...]}}`` with the
right status: not JSON -> 400, bad fields -> 422 naming them, too large -> 413, no token -> 401,
wrong scope -> 403, unknown thing -> 404, too many requests or failed tokens -> 429 (Retry-After), database down
-> 503. Nothing secret goes into an error.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, g, jsonify, request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.json_schema import models_json_schema
from werkzeug.exceptions import HTTPException

from api.limits import AuthFailures, RateLimiter
from db.api_tokens import authenticate
from db.audit import append_event
from db.store import StoreUnavailable

log = logging.getLogger(__name__)
THROTTLED_EVENT = "token.throttled"  # a client address or token prefix throttled after failed authentications


# ---- errors ----------------------------------------------------------------------------------
class ErrorBody(BaseModel):
    """One error shape on every route of both services, OpenAI's (``message``, ``type``, ``param``, ``code``)
    with ``details`` added: the official OpenAI clients raise their own exception classes with this message."""

    message: str
    type: str = Field(description="the kind of error, as OpenAI names them (invalid_request_error, ...)")
    param: str | None = Field(None, description="the request field at fault, when one is")
    code: str
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, details: list | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.details, self.headers = details, headers or {}


ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               409: "conflict_error", 429: "rate_limit_error"}  # OpenAI's names; other 4xx: invalid_request_error


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(status: int, code: str, message: str, details: list | None = None) -> dict:
    """``{"error": ...}`` as every answer of both services gives it (``ErrorBody``)."""
    param = details[0].get("field") if details and isinstance(details[0], dict) else None
    body: dict[str, Any] = {"message": message, "type": error_type(status), "param": param, "code": code}
    if details:
        body["details"] = details
    return {"error": body}


def error_response(status: int, code: str, message: str, details: list | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    response = jsonify(error_body(status, code, message, details))
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.errorhandler(StoreUnavailable)
    def _store_down(exc: StoreUnavailable):
        log.warning("database unavailable: %s", type(exc).__name__)
        return error_response(503, "database_unavailable", "the database is unreachable; nothing was stored",
                              headers={"Retry-After": "5"})

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        code = re.sub(r"[^a-z0-9]+", "_", (exc.name or "error").lower()).strip("_")
        headers = {}
        if exc.code == 405 and exc.valid_methods:
            headers["Allow"] = ", ".join(exc.valid_methods)
        message = exc.description or exc.name
        if exc.code == 413 and app.config.get("MAX_CONTENT_LENGTH"):
            error = body_too_large(app.config["MAX_CONTENT_LENGTH"])
            return error_response(413, error.code, error.message, error.details, headers=headers)
        return error_response(exc.code or 500, code, message, headers=headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error")


# ---- deprecated spellings ----
def deprecated(message: str) -> None:
    """Note that this request used a spelling that still works for one release; the answer says so in its
    ``Deprecation`` and ``Warning`` headers (``install_deprecation_headers``)."""
    g.setdefault("deprecations", []).append(message)


def install_deprecation_headers(app: Flask) -> None:
    @app.after_request
    def _deprecation_headers(response: Response) -> Response:
        notes = g.get("deprecations")
        if notes:
            response.headers["Deprecation"] = "true"
            for note in notes:
                response.headers.add("Warning", f'299 provmark "{note}"')
        return response


# ---- request bodies --------------------------------------------------------------------------
class StrictModel(BaseModel):
    """Request models reject unknown fields, so typos are 422s rather than silently ignored."""

    model_config = ConfigDict(extra="forbid")


MAX_JSON_DEPTH = 32
BODY_BYTES_PER_CHAR = 6  # a character may arrive as a \uXXXX escape
BODY_OVERHEAD_BYTES = 64 * 1024  # the other fields of a request


def body_limit(max_text_chars: int) -> int:
    """The largest request body either service reads, in bytes."""
    return max_text_chars * BODY_BYTES_PER_CHAR + BODY_OVERHEAD_BYTES


TOO_LARGE = "too_large"  # every refusal past a size limit (api.refusals for texts and prompts)
BODY_TOO_LARGE_BEFORE = "request_entity_too_large"  # this refusal's code until this release


def body_too_large(limit: int) -> ApiError:
    """The 413 of a request body past ``limit`` bytes; the old code stays in details for one release."""
    deprecated(f"error code {BODY_TOO_LARGE_BEFORE} is now {TOO_LARGE}; details[0].deprecated_code keeps the old "
               "one for one release")
    message = f"the request body is too large: the limit is {limit} bytes"
    return ApiError(413, TOO_LARGE, message, details=[{"field": "body", "message": message, "limit": limit,
                                                       "deprecated_code": BODY_TOO_LARGE_BEFORE}])


def install_body_limit(app: Flask, max_text_chars: int) -> None:
    """Bodies past ``body_limit`` get a JSON 413 (werkzeug checks Content-Length before reading a byte,
    and stops a chunked body at the limit)."""
    app.config["MAX_CONTENT_LENGTH"] = body_limit(max_text_chars)


def json_depth(data: Any) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), walked without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (value.values() if isinstance(value, dict) else value))
    return deepest


def parse_body(model: type[BaseModel]) -> BaseModel:
    """The request's JSON body validated into ``model``; 413 past the body limit, 400 if not a JSON
    object or nested deeper than MAX_JSON_DEPTH, 422 on bad fields."""
    raw = request.get_data(cache=True)  # also when the client sent a form content type (curl -d)
    limit = current_app.config.get("MAX_CONTENT_LENGTH")
    if request.content_length is None and "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        if not raw:  # the WSGI bridge under gunicorn does not pass a body of unknown length on
            raise ApiError(411, "length_required", "send the body with a Content-Length header, not chunked")
        if limit and len(raw) >= limit:  # werkzeug's own server does, and werkzeug cut it at the limit
            raise body_too_large(limit)
    try:
        data = json.loads(raw) if raw else None
    except RecursionError:  # deeper than the parser's stack: far past MAX_JSON_DEPTH
        raise ApiError(400, "invalid_json", f"the request body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", "the request body must be a JSON object")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise ApiError(400, "invalid_json", f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    # JSON types, as the OpenAPI document states them: no "1" for 1 or 1 for true (strict), while 3.0 is
    # the integer 3 (JSON Schema's reading, which clients and fuzzers rely on)
    return validate(model, _integral_floats_as_ints(data), strict=True)


def parse_query(model: type[BaseModel]) -> BaseModel:
    return validate(model, {k: v for k, v in request.args.items()})


def _integral_floats_as_ints(data: Any) -> Any:
    if isinstance(data, float):
        return int(data) if data.is_integer() else data
    if isinstance(data, dict):
        return {key: _integral_floats_as_ints(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_integral_floats_as_ints(value) for value in data]
    return data


def validate(model: type[BaseModel], data: dict, strict: bool | None = None) -> BaseModel:
    """``data`` validated into ``model`` (``strict``: JSON bodies, no type coercion); 422 naming the fields."""
    try:
        return model.model_validate(data, strict=strict)
    except ValidationError as exc:
        details = [{"field": ".".join(str(p) for p in err["loc"]) or "(body)", "message": err["msg"]}
                   for err in exc.errors(include_url=False, include_input=False)]
        fields = ", ".join(sorted({d["field"] for d in details}))
        raise ApiError(422, "invalid_fields", f"invalid fields: {fields}", details=details) from None


# ---- auth and rate limits ----------------------------------------------------------------------
class Auth:
    """Bearer tokens (see db.api_tokens) with scopes, the rate limit, and failed authentications throttled per
    address and token prefix (``api.limits.AuthFailures``: always on, whatever the rate limit)."""

    def __init__(self, store, limiter: RateLimiter | None = None, failures: AuthFailures | None = None) -> None:
        self.store = store
        self.limiter = limiter
        self.failures = failures if failures is not None else AuthFailures()

    def require(self, scope: str) -> Callable:
        def decorate(view):
            @functools.wraps(view)
            def wrapped(*args, **kwargs):
                g.token = self.check(scope)
                return view(*args, **kwargs)

            wrapped.required_scope = scope
            return wrapped

        return decorate

    def check(self, scope: str):
        header = request.headers.get("Authorization", "")
        kind, _, plaintext = header.partition(" ")
        if kind.lower() != "bearer" or not plaintext.strip():
            raise ApiError(401, "unauthorized", "an API token is required: Authorization: Bearer <token>",
                           headers={"WWW-Authenticate": 'Bearer realm="provmark"'})
        presented, address = plaintext.strip(), request.remote_addr or "unknown"
        wait = self.failures.prefix_wait(presented)  # before the lookup: a throttled prefix is not even checked
        if wait <= 0:
            info = authenticate(self.store, presented)
            if info is None:
                wait = self.failures.address_wait(address)  # a live token from this address still passes
                if wait <= 0:
                    for key in self.failures.failed(address, presented):
                        self._audit_throttled(key, address)
                    raise ApiError(401, "unauthorized", "the API token is unknown or revoked",
                                   headers={"WWW-Authenticate": 'Bearer realm="provmark", error="invalid_token"'})
        if wait > 0:
            raise ApiError(429, "too_many_failed_authentications",
                           "too many unknown or revoked API tokens from this address (or with this token's "
                           "prefix); wait before trying again", headers={"Retry-After": str(max(1, math.ceil(wait)))})
        if not info.allows(scope):
            raise ApiError(403, "forbidden", f"this token lacks the {scope!r} scope")
        if self.limiter is not None:
            wait = self.limiter.take(info.token_id)
            if wait > 0:
                raise ApiError(429, "rate_limited", "too many requests for this token",
                               headers={"Retry-After": str(max(1, math.ceil(wait)))})
        return info

    def _audit_throttled(self, key: str, address: str) -> None:
        """The ``token.throttled`` audit event (module ``api.limits``): the address and, for a prefix, its short
        hash; never the token. A database that is down only loses the event."""
        by, _, name = key.partition(":")
        details = {"throttled": by, "address": address, "burst": int(self.failures.limiter.capacity),
                   "per_minute": self.failures.limiter.rate * 60.0}
        if by == "prefix":
            details["prefix_sha256"] = name
        try:
            with self.store.write() as session:
                append_event(session, THROTTLED_EVENT, "service", None, details)
        except StoreUnavailable:
            log.warning("a token.throttled audit event was lost: the database is unreachable")

    def limit_anonymous(self) -> None:
        """The rate limit for a route that takes no token, per client address (``request.remote_addr``: behind
        a reverse proxy every client shares the proxy's address unless the proxy sets it, e.g. werkzeug's
        ProxyFix): asking without a token is not a way around a token's limit. 429 beyond it."""
        if self.limiter is not None:
            wait = self.limiter.take("address:" + (request.remote_addr or "unknown"))
            if wait > 0:
                raise ApiError(429, "rate_limited", "too many requests from this address",
                               headers={"Retry-After": str(max(1, math.ceil(wait)))})


# ---- OpenAPI -------------------------------------------------------------------------------------
class OpenAPI:
    """Routes registered through ``route`` are both Flask routes and OpenAPI operations."""

    def __init__(self, title: str, version: str, description: str = "") -> None:
        self.info = {"title": title, "version": version, "description": description}
        self.operations: list[dict] = []
        self.models: set[type[BaseModel]] = {ErrorResponse}

    def route(self, target, rule: str, *, methods: list[str], summary: str, body: type[BaseModel] | None = None,
              query: type[BaseModel] | None = None, responses: dict[int, Any] | None = None,
              scope: str | tuple[str, ...] | None = None, tags: list[str] | None = None,
              content_type: str = "application/json"):
        """``responses`` maps status -> a pydantic model, a ``(media_type, description)`` pair, or a
        description string (no body)."""

        def decorate(view):
            target.add_url_rule(rule, view_func=view, methods=methods)
            for method in methods:
                self.operations.append({"rule": rule, "method": method.lower(), "summary": summary,
                                        "body": body, "query": query, "responses": responses or {},
                                        "scope": scope, "tags": tags or [], "content_type": content_type,
                                        "name": view.__name__})
            for model in (body, query, *(responses or {}).values()):
                if isinstance(model, type) and issubclass(model, BaseModel):
                    self.models.add(model)
            return view

        return decorate

    def document(self) -> dict:
        _, defs = models_json_schema([(m, "validation") for m in sorted(self.models, key=lambda m: m.__name__)],
                                     ref_template="#/components/schemas/{model}")
        schemas = defs.get("$defs", {})
        paths: dict[str, dict] = {}
        for op in self.operations:
            path = re.sub(r"<(?:[a-z]+:)?([a-zA-Z_]+)>", r"{\1}", op["rule"])
            params = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                      for name in re.findall(r"{([a-zA-Z_]+)}", path)]
            if op["query"] is not None:
                props = op["query"].model_json_schema(ref_template="#/components/schemas/{model}")
                required = set(props.get("required", []))
                for name, schema in props.get("properties", {}).items():
                    params.append({"name": name, "in": "query", "required": name in required, "schema": schema})
            operation: dict[str, Any] = {"summary": op["summary"], "operationId": op["name"] + "_" + op["method"],
                                         "tags": op["tags"], "responses": {}}
            if params:
                operation["parameters"] = params
            if op["body"] is not None:
                operation["requestBody"] = {"required": True, "content": {"application/json": {
                    "schema": {"$ref": f"#/components/schemas/{op['body'].__name__}"}}}}
            elif op["content_type"] != "application/json":  # a raw body, e.g. a text: any bytes are one
                operation["requestBody"] = {"required": True, "content": {op["content_type"]: {
                    "schema": {"description": f"the raw body ({op['content_type']})"}}}}
            for status, spec in op["responses"].items():
                operation["responses"][str(status)] = _response_object(spec)
            errors = [400, 422] if op["body"] is not None or op["content_type"] != "application/json" else []
            errors += [422] if op["query"] is not None else []
            errors += [401, 403, 429] if op["scope"] else []
            errors += [503]
            for status in sorted(set(errors)):
                operation["responses"].setdefault(str(status), {
                    "description": "error", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ErrorResponse"}}}})
            if op["scope"]:
                operation["security"] = [{"bearer": []}]
                operation["x-required-scope"] = op["scope"]
            paths.setdefault(path, {})[op["method"]] = operation
        return {"openapi": "3.1.0", "info": self.info, "paths": paths,
                "components": {"schemas": schemas,
                               "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


def _response_object(spec) -> dict:
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return {"description": spec.__doc__.strip().splitlines()[0] if spec.__doc__ else spec.__name__,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{spec.__name__}"}}}}
    if isinstance(spec, tuple):
        media, description = spec
        return {"description": description, "content": {media: {"schema": {"type": "string"}}}}
    return {"description": str(spec)}


__all__ = ["ApiError", "Auth", "ErrorResponse", "Field", "OpenAPI", "RateLimiter", "StrictModel", "deprecated",
           "install_deprecation_headers",
           "error_response", "install_body_limit", "install_error_handlers", "parse_body", "parse_query", "validate"]
