"""The detector service: a Flask app factory (no model weights, one tokenizer per process).

Routes (``/openapi.json`` documents them from the same pydantic models that validate requests):

    GET  /                    the paste-text page (api/detector/templates, api/detector/static; no external resource)
    GET  /healthz             liveness + database reachability (503 when the database is down)
    GET  /openapi.json        the OpenAPI 3.1 document
    POST /v1/detect           scope ``detect`` (``explain=true`` also needs ``explain``)
    GET  /v1/verdicts         scope ``audit``; filters, cursor pages, CSV export
    GET  /v1/verdicts/<id>    scope ``audit``
    GET  /v1/audit            scope ``audit``; the hash-chained audit events, paged
    GET  /v1/audit/verify     scope ``audit``; the chain check (``AuditReport``)
    GET  /v1/keys/<id>/public-half no token; a two-part key's public half (``watermark.public_key``)
    GET  /.well-known/jwks.json  no token; the keys that verify generation receipts (api/provenance_keys.py)
    GET  /v1/c2pa/trust-anchors  no token; the PEM roots C2PA manifests chain to (api/provenance_keys.py)
    GET  /v1/manifests/<id>, /v1/services/supportedAlgorithms, /v1/matches/byBinding, POST /v1/matches/byContent
                              the C2PA Soft Binding Resolution API (api/detector/routes_resolution.py)
    GET  /v1/log/head         no token; the transparency log's newest signed tree head (routes_log.py)
    GET  /v1/log/public-key   no token; the log's public key (JWK, PEM, checkpoint verifier key)
    GET  /v1/log/proof/inclusion    scopes ``audit`` and ``explain``; an event's inclusion proof bundle
    GET  /v1/log/proof/consistency  no token; a consistency proof bundle between two kept heads
    GET  /metrics             Prometheus text format, no token by default (see api/metrics.py)
    GET  /docs                no token; the OpenAPI document as a browsable page (api/api_page.py)

Configuration: ``api.settings.Settings`` (the ``PROVMARK_*`` variables both services share, overridden by
the ``config`` dict given to ``create_app``, same names in lower case); the detector reads ``home``,
``database_url``, ``max_text_chars``, ``rate_limit``, ``rate_burst``, ``retain_text`` and ``detect_budget``.

Config-only keys: ``store`` (a ``db.store.Store``), ``detector`` (a ``Detector``), ``keyring``,
``vocab`` (shares an already loaded tokenizer), ``bootstrap`` (False skips migrations and the
bootstrap admin token, for apps whose database is prepared elsewhere), ``auth_failures`` (an
``api.limits.AuthFailures``: the failed-token throttle).

On start the app applies migrations and, the first time, creates an admin token, writes it to
``$PROVMARK_HOME/admin.token`` (0600) and prints it once on stderr. If the database is unreachable
at start the app still starts, answers 503, and retries the bootstrap on the next request.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, fields
from typing import Any

from flask import Flask, jsonify, request
from sqlalchemy import text as sql_text

from api.api_page import ENDPOINTS as API_PAGE_ENDPOINTS
from api.api_page import install_api_page
from api.detector import (
    routes_audit,
    routes_detect,
    routes_keys,
    routes_log,
    routes_page,
    routes_resolution,
    routes_verdicts,
)
from api.detector.schemas import Health
from api.http import Auth, OpenAPI, RateLimiter, install_body_limit, install_deprecation_headers, install_error_handlers
from api.limits import install_security_headers
from api.metrics import count_verdict, install_metrics
from api.provenance_keys import PublicKeys
from api.settings import Settings
from db import passage_signature
from db.api_tokens import ADMIN_TOKEN_FILE, announce_admin_token, ensure_admin_token
from db.budget import UsageLedger
from db.output_memory import MemoryMirror, OutputMemory
from db.semantic_memory import SemanticMemory, SignatureMirror
from db.store import Store, StoreUnavailable
from detector.service import Detector
from provenance.identity import IdentityError
from provenance.identity_files import home_conflicts
from watermark.keys import Keyring
from watermark.vocab import load_vocabulary

log = logging.getLogger(__name__)

SERVICE_NAME = "provmark-detector"
API_VERSION = "1.0.0"
OBJECT_NAMES = ("store", "detector", "keyring", "vocab", "bootstrap", "auth_failures")
EXTENSION = "provmark_detector"
# need no bootstrap (a published key half comes from the keyring; the JWKS, trust anchors and log key are read
# from the database's identity when it answers)
PAGE_ENDPOINTS = frozenset({"static", "page.index", "openapi_json", "prometheus_metrics", "keys.public_key",
                            "keys.jwks", "keys.c2pa_trust_anchors", "resolution.supported_algorithms",
                            "log.log_public_key"}) | API_PAGE_ENDPOINTS


@dataclass(slots=True)
class DetectorServices:
    """What the routes share in one process: settings, store, detector, auth."""

    settings: Settings
    store: Store
    detector: Any  # detector.service.Detector
    auth: Auth
    # One detection at a time per process: the fast tokenizer is not safe to call from several
    # threads at once, and scoring is CPU-bound anyway (gunicorn workers give the parallelism).
    detect_lock: threading.Lock = field(default_factory=threading.Lock)
    bootstrapped: bool = False
    usage: Any = None  # db.budget.UsageLedger of this process
    public_keys: Any = None  # api.provenance_keys.PublicKeys: the deployment's JWKS, log key, trust anchors
    bootstrap_lock: threading.Lock = field(default_factory=threading.Lock)

    def ensure_bootstrapped(self) -> None:
        """Migrations + the first admin token, once; StoreUnavailable while the database is down."""
        if self.bootstrapped:
            return
        with self.bootstrap_lock:
            if self.bootstrapped:
                return
            self.store.upgrade()
            self._check_identity()
            token = ensure_admin_token(self.settings.home, self.store)
            if token is not None:
                path = self.settings.home / ADMIN_TOKEN_FILE
                announce_admin_token("detector", token, path)
            self.bootstrapped = True

    def _check_identity(self) -> None:
        """Refuse to serve with another identity than the database's (``PROVMARK_IDENTITY``, or key files in
        this replica's home that are not the deployment's); no identity yet is fine: nothing is made here."""
        identity = self.public_keys.cache.get()
        if identity is None:
            return
        problems = home_conflicts(self.settings.home, identity)
        if self.settings.identity is not None and identity.deployment_id != self.settings.identity:
            problems.append(f"the database holds deployment {identity.deployment_id}, not {self.settings.identity} "
                            "(PROVMARK_IDENTITY)")
        if problems:
            raise IdentityError("; ".join(problems) + ": this replica would serve with another identity than "
                                "the database's")


def create_app(config: dict | None = None) -> Flask:
    """The detector service app; ``config`` keys override environment variables (module docstring)."""
    config = dict(config or {})
    unknown = sorted(set(config) - {f.name for f in fields(Settings)} - set(OBJECT_NAMES))
    if unknown:
        raise ValueError(f"unknown detector config keys: {', '.join(unknown)}")
    settings = Settings.load(config)
    store = config.get("store") or Store(settings.database_url, home=settings.home,
                                          retain_text=settings.retain_text)
    detector = config.get("detector") or _make_detector(settings, config.get("vocab"), config.get("keyring"), store)
    limiter = RateLimiter(settings.rate_limit, settings.rate_burst) if settings.rate_limit > 0 else None
    services = DetectorServices(settings, store, detector, Auth(store, limiter, config.get("auth_failures")),
                                usage=UsageLedger(store),
                                public_keys=PublicKeys(settings, store))

    app = Flask(__name__, static_folder="static", template_folder="templates")
    install_body_limit(app, settings.max_text_chars)
    install_deprecation_headers(app)
    install_security_headers(app)  # nosniff, no referrer, the page CSP (api.limits)
    app.json.sort_keys = False
    app.extensions[EXTENSION] = services
    install_error_handlers(app)
    _install_metrics(app)
    api = OpenAPI("provmark detector", API_VERSION,
                  "Scores text for provmark watermarks, keeps verdicts and an audit trail.")
    _register_blueprints(app, api, services)
    _register_meta_routes(app, api, services)
    install_api_page(app)

    if config.get("bootstrap", True):
        try:
            services.ensure_bootstrapped()
        except StoreUnavailable as error:
            log.warning("database unavailable at start; answering 503 until it is back: %s", error)
        # No pooled connection outlives the start: a server that forks workers now shares none.
        store.engine.dispose()

        @app.before_request
        def _bootstrap_when_back():
            if request.endpoint not in PAGE_ENDPOINTS:  # the page itself needs no database
                services.ensure_bootstrapped()
    else:
        services.bootstrapped = True
    return app


def services_of(app: Flask) -> DetectorServices:
    return app.extensions[EXTENSION]


def _install_metrics(app: Flask) -> None:
    """GET /metrics (api/metrics.py): requests per route and status, latencies, verdicts by verdict."""
    metrics = install_metrics(app, SERVICE_NAME)

    @app.after_request
    def _count_verdicts(response):
        if request.endpoint == "detect.detect_text":
            count_verdict(metrics, response)
        return response


def _make_detector(settings: Settings, vocab, keyring, store: Store):
    # Load the tokenizer now, once per process, rather than inside the first request. The generation
    # service's record of its own output (same store) gives positives their spoof check, and every keyed verdict
    # the own-output match and, unless PROVMARK_SEMANTIC_OUTPUTS is 0, paraphrase_of_own_output.
    semantic = SemanticMemory(store, keep=settings.semantic_outputs)
    vocab = vocab or load_vocabulary()
    if semantic.enabled:
        passage_signature.warm_up()  # the fitted stems and their table now, not on the first request (shared across the fork)
    return Detector(vocab=vocab, keyring=keyring or Keyring(settings.home),
                    output_memory=MemoryMirror(OutputMemory(store), grams_kept=settings.remembered_outputs),
                    semantic_memory=SignatureMirror(semantic) if semantic.enabled else None)


def _register_blueprints(app: Flask, api: OpenAPI, services: DetectorServices) -> None:
    for module in (routes_page, routes_detect, routes_verdicts, routes_audit, routes_keys, routes_resolution,
                   routes_log):
        app.register_blueprint(module.blueprint(api, services))


def _register_meta_routes(app: Flask, api: OpenAPI, services: DetectorServices) -> None:
    @api.route(app, "/healthz", methods=["GET"], summary="Liveness and database reachability",
               responses={200: Health}, tags=["meta"])
    def healthz():
        with services.store.read() as session:
            session.execute(sql_text("SELECT 1"))
        return jsonify(Health(status="ok", service=SERVICE_NAME, database=services.store.dialect,
                              model_id=services.detector.vocab.model_id).model_dump())

    document: dict = {}

    @app.get("/openapi.json")
    def openapi_json():
        services.auth.limit_anonymous()
        if not document:
            document.update(_with_csv_export(api.document()))
        return jsonify(document)



def _with_csv_export(document: dict) -> dict:
    """GET /v1/verdicts also answers text/csv (``?format=csv`` or ``Accept: text/csv``)."""
    operation = document["paths"].get("/v1/verdicts", {}).get("get")
    if operation is not None:
        content = operation["responses"]["200"].setdefault("content", {})
        content["text/csv"] = {"schema": {"type": "string"}}
    return document
