"""The generation service: ``create_app(config=None) -> Flask``.

Routes: POST /v1/generate (provmark's API), POST /v1/completions, POST /v1/chat/completions and
GET /v1/models (OpenAI-compatible), GET /.well-known/jwks.json (no auth: the keys that verify receipts),
GET /v1/c2pa/trust-anchors (no auth: the roots its C2PA manifests chain to),
GET /v1/receipts/public-key (no auth; the legacy form of the current key), GET /healthz (no auth),
GET /openapi.json, GET /docs (the same document as a page: api/api_page.py), GET /metrics (Prometheus, no
token by default: api/metrics.py). The model loads once at start; one engine runs in a background thread
(``api.generation.engine_worker``) and concurrent requests share its continuous batches.

Configuration: ``api.settings.Settings`` (the ``PROVMARK_*`` variables both services share; ``config`` keys
override them, same names in lower case); generation reads ``home``, ``database_url``, ``model``,
``device``, ``dtype``, ``max_num_seqs``, ``max_pending``, ``rate_limit``, ``rate_burst``, ``max_text_chars``,
``issuer`` and ``detector_url``.

``config["engine"]`` may hand in a ready ``generation.engine.Engine`` (tests share one loaded model), and
``config["auth_failures"]`` an ``api.limits.AuthFailures`` (the failed-token throttle; a fuzzer raises its burst).
On first start an admin token is created, written to ``home/admin.token`` (0600) and printed once;
an empty keyring gets a first (active) watermark key so the default watermark works. The service signs
with the deployment's identity (``api.provenance_keys.SigningKeys``) and keeps the transparency log's
signed heads fresh (``db.transparency.HeadSequencer``, every ``log_head_interval`` seconds while it grows).
"""

from __future__ import annotations

import atexit
import logging
import threading
from pathlib import Path

from flask import Blueprint, Flask, jsonify
from pydantic import BaseModel

from api.api_page import install_api_page
from api.generation import openai_compat, routes_native
from api.generation.credentials import Credentials
from api.generation.engine_worker import EngineWorker
from api.generation.routes_common import GenerationService, GenerationServices
from api.generation.routes_models import TOKEN_ID_MARK
from api.http import (
    Auth,
    OpenAPI,
    RateLimiter,
    deprecated,
    install_body_limit,
    install_deprecation_headers,
    install_error_handlers,
)
from api.limits import install_security_headers
from api.metrics import EngineCollector, install_metrics
from api.provenance_keys import PublicKeys, SigningKeys, add_jwks_route, add_trust_anchors_route
from api.settings import Settings
from db import passage_signature
from db.api_tokens import ADMIN_TOKEN_FILE, announce_admin_token, ensure_admin_token
from db.receipts import ReceiptError, ReceiptLinks
from db.semantic_memory import SemanticMemory
from db.store import Store
from db.transparency import SIGNER_STATE_FILE, HeadGuard, HeadSequencer
from detector.calibrate import ensure_screened_active_key
from generation.engine import Engine
from generation.models import load_model
from generation.runner import ComputePaths
from provenance.c2pa_credential import C2paCredentialError
from provenance.identity import IdentityError
from watermark.keys import Keyring
from watermark.processor import warm_up

log = logging.getLogger(__name__)

SERVICE_ACTOR = "generation-service"
STREAMING_OPERATIONS = ("/v1/generate", "/v1/completions", "/v1/chat/completions")
# OpenAPI 3.1: the schema of an event-stream response describes one event
SSE_EVENT_SCHEMA = {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string", "description": "one JSON chunk, or [DONE] at the end"},
    "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}


class HealthEngine(BaseModel):
    steps: int
    max_batch_size: int
    shared_steps: int
    requests_submitted: int
    requests_finished: int
    tokens_generated: int
    in_flight: int
    failures: int
    alive: bool
    broken: bool


class Health(BaseModel):
    """Service health and engine counters (max_batch_size > 1 shows requests shared a step)."""

    status: str
    model: str
    max_num_seqs: int
    engine: HealthEngine


class PublicKey(BaseModel):
    """The Ed25519 public key that verifies this service's receipts."""

    algorithm: str
    signer_id: str
    public_key_pem: str
    public_key_b64: str


def create_app(config: dict | None = None) -> Flask:
    """The generation service's Flask app; loads the model and starts the engine thread."""
    settings = Settings.load(config)
    settings.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store(url=settings.database_url, home=settings.home)
    store.upgrade()
    _bootstrap_admin(settings.home, store)
    keyring = Keyring(settings.home)
    keys = _signing_keys(settings, store)
    engine = (config or {}).get("engine") or _load_engine(settings)
    _ensure_watermark_key(keyring, store, engine.loaded.vocab)
    worker = EngineWorker(engine, max_pending=settings.max_pending).start()
    atexit.register(worker.stop)
    _warm_up_watermark(engine)
    sequencer = None
    if settings.log_head_interval > 0:
        guard = HeadGuard(settings.home / SIGNER_STATE_FILE)
        sequencer = HeadSequencer(store, keys.log, settings.log_head_interval, guard).start()
        atexit.register(sequencer.stop)
    credentials = Credentials(store, keys.receipts, keys.c2pa, model_id=engine.loaded.model_id,
                              links=ReceiptLinks(issuer=settings.issuer, detector=settings.detector_url))
    semantic = SemanticMemory(store, keep=settings.semantic_outputs)
    if semantic.enabled:
        passage_signature.warm_up()  # the fitted stems and table the outputs' signatures need: not on a request
    service = GenerationService(worker, store, keyring, credentials, model_id=engine.loaded.model_id,
                                max_prompt_chars=settings.max_text_chars, public_keys=PublicKeys(settings, store),
                                semantic=semantic)

    app = Flask("provmark.generation")
    install_body_limit(app, settings.max_text_chars)
    install_deprecation_headers(app)
    install_security_headers(app)  # the detector's: nosniff, no referrer, the page CSP on /docs (api.limits)
    app.json.sort_keys = False
    app.extensions["provmark.generation"] = service
    app.extensions["provmark.store"] = store
    app.extensions["provmark.log_heads"] = sequencer  # db.transparency.HeadSequencer, or None
    install_error_handlers(app)
    _install_metrics(app, worker)
    api = _openapi()
    auth = Auth(store, RateLimiter(settings.rate_limit, settings.rate_burst) if settings.rate_limit > 0 else None,
                (config or {}).get("auth_failures"))
    for bp in _blueprints(api, auth, service, engine.config.max_num_seqs):
        app.register_blueprint(bp)
    install_api_page(app)
    return app


def openapi_document() -> dict:
    """The service's OpenAPI document without a model, an engine or a database (docs/gen_reference.py):
    the same routes registered on blueprints that never serve. The served /openapi.json adds what only a
    running process knows (its model names, its vocabulary's largest token id)."""
    api = _openapi()
    _blueprints(api, Auth(None), None, 0)
    return api.document()


def _openapi() -> OpenAPI:
    return OpenAPI("provmark generation service", _version(), "Watermarked generation with signed receipts.")


def _blueprints(api: OpenAPI, auth: Auth, service, max_num_seqs: int) -> list[Blueprint]:
    """Every route of the service, in one list: create_app serves them, openapi_document documents them."""
    services = GenerationServices(service, auth)
    return [*(module.blueprint(api, services) for module in (routes_native, openai_compat)),
            _meta_blueprint(api, auth, service, max_num_seqs)]


def _warm_up_watermark(engine) -> None:
    """Compile the default spec's bias kernel in the background: the first watermarked request would
    otherwise wait for it (about 5 s here). A failure only means that request compiles it instead. Where
    the engine registered its C++ bias (generation/cpu/native.py) this only exercises that, in milliseconds."""
    def run() -> None:
        try:
            warm_up(engine.vocab_size, device=engine.runner.device)
        except Exception:  # best effort: the request path compiles, or falls back to eager, by itself
            log.warning("watermark kernel warm-up failed; the first watermarked request will compile it",
                        exc_info=True)

    threading.Thread(target=run, name="provmark-watermark-warm-up", daemon=True).start()


def _install_metrics(app: Flask, worker: EngineWorker) -> None:
    """GET /metrics (api/metrics.py): requests, latencies, engine occupancy, queue depth, tokens."""
    install_metrics(app, "provmark-generation").add_live_collector(EngineCollector(worker.occupancy, worker.stats))


def _meta_blueprint(api: OpenAPI, auth: Auth, service: GenerationService, max_num_seqs: int) -> Blueprint:
    """/healthz (no limit: probes poll it), and the routes anyone may read without a token, each rate-limited per
    client address as the detector's are (``Auth.limit_anonymous``)."""
    bp = Blueprint("meta", __name__)

    @api.route(bp, "/healthz", methods=["GET"], summary="Health and engine counters",
               responses={200: Health}, tags=["meta"])
    def healthz():
        stats = service.worker.stats()
        ok = stats["alive"] and not stats["broken"]
        body = {"status": "ok" if ok else "unavailable", "model": service.model_id, "max_num_seqs": max_num_seqs,
                "engine": stats}
        return jsonify(body), 200 if ok else 503

    @api.route(bp, "/v1/receipts/public-key", methods=["GET"], summary="The receipt-signing public key",
               responses={200: PublicKey}, tags=["receipts"])
    def public_key():
        auth.limit_anonymous()
        deprecated("GET /v1/receipts/public-key is deprecated; the JWKS at /.well-known/jwks.json has every key")
        signer = service.signer
        return jsonify({"algorithm": "Ed25519", "signer_id": signer.signer_id,
                        "public_key_pem": signer.public_key_pem(), "public_key_b64": signer.public_key_b64()})

    add_jwks_route(api, bp, lambda: service.public_keys.jwks(), before=auth.limit_anonymous)
    add_trust_anchors_route(api, bp, lambda: service.credentials.c2pa_credential.trust_anchors_pem,
                            before=auth.limit_anonymous)

    @bp.get("/openapi.json")
    def openapi():
        auth.limit_anonymous()
        return jsonify(_served_specifics(api.document(), sorted(service.model_names), service.vocab_size))

    return bp

def _served_specifics(document: dict, model_names: list[str], vocab_size: int) -> dict:
    """What the static models cannot say: streaming routes answer 200 as JSON or, with ``stream: true``,
    as server-sent events; the OpenAI ``model`` field takes the names this process serves; token ids
    lie below the model's vocabulary size."""
    _bound_token_ids(document["components"]["schemas"], vocab_size - 1)
    for path in STREAMING_OPERATIONS:
        ok = document["paths"].get(path, {}).get("post", {}).get("responses", {}).get("200")
        if ok is not None:
            ok.setdefault("content", {})["text/event-stream"] = {"schema": SSE_EVENT_SCHEMA}
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        field = document["components"]["schemas"].get(name, {}).get("properties", {}).get("model")
        if field is not None:
            field["enum"] = model_names
    return document


def _bound_token_ids(node, largest: int) -> None:
    if isinstance(node, dict):
        if node.get(TOKEN_ID_MARK):
            node["maximum"] = largest
        for child in node.values():
            _bound_token_ids(child, largest)
    elif isinstance(node, list):
        for child in node:
            _bound_token_ids(child, largest)


def _load_engine(settings: Settings):
    loaded = load_model(settings.model, device=settings.device, dtype=settings.dtype)
    return Engine(loaded, max_num_seqs=settings.max_num_seqs,
                  paths=ComputePaths(int8_weights=settings.weights == "int8"))


def _signing_keys(settings: Settings, store: Store) -> SigningKeys:
    """The deployment's signing keys. The first start of a single-machine install (SQLite) makes the
    identity; on a shared database it is made once by `provmark identity init`, and a replica that finds
    none, or another than its own, refuses to start."""
    try:
        keys = SigningKeys(settings, store, create=store.dialect == "sqlite", actor=SERVICE_ACTOR)
    except (IdentityError, ReceiptError, C2paCredentialError) as error:
        raise ValueError(f"the generation service cannot sign: {error}") from None
    if store.dialect != "sqlite" and any(_is_loopback(url) for url in (settings.issuer, settings.detector_url)):
        log.warning("receipts and manifests name %s and %s: set PROVMARK_ISSUER and PROVMARK_DETECTOR_URL to the "
                    "public URLs verifiers use", settings.issuer, settings.detector_url)
    return keys


def _is_loopback(url: str) -> bool:
    host = url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _bootstrap_admin(home: Path, store) -> None:
    token = ensure_admin_token(home, store)
    if token is not None:
        announce_admin_token("generation", token, home / ADMIN_TOKEN_FILE)


def _ensure_watermark_key(keyring, store, vocab) -> None:
    """A keyring without an active key gets one that passed key screening (detector.calibrate),
    recorded with its calibration in the store's audit log."""
    info, calibration = ensure_screened_active_key(keyring, vocab)
    if calibration is not None:
        store.record_key_event(info, "create", SERVICE_ACTOR)
        store.record_key_event(info, "calibrate", SERVICE_ACTOR, details=calibration)
        log.info("created watermark key %s (active, calibration %s)", info.key_id, calibration["id"])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("provmark")
    except PackageNotFoundError:
        return "0.0.0"
