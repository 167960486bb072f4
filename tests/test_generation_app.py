"""The generation service over real sockets: /v1/generate (plain, streaming, errors), receipts and
their audit events, the engine thread sharing one batch between concurrent requests, health, OpenAPI."""

import http.client
import json
import threading
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest
from http_fixtures import call, make_token, serve

from api.generation.app import create_app
from db.audit import list_events
from db.output_grams import gram_key, text_grams
from db.output_memory import OutputMemory
from db.receipts import get_receipt, verify_receipt
from db.rows import text_sha256
from detector.normalize import normalize
from generation.sample.params import SamplingParams
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark
from watermark.vocab import encode

pytestmark = pytest.mark.slow  # loads the embedded model
MAX_TEXT_CHARS = 2000
CONCURRENT = 4


@pytest.fixture(scope="module")
def live(tmp_path_factory, loaded):
    from generation.engine import Engine

    home = tmp_path_factory.mktemp("generation-home")
    engine = Engine(loaded, max_num_seqs=8, max_model_len=256)
    app = create_app({"home": home, "engine": engine, "rate_limit": 0, "max_text_chars": MAX_TEXT_CHARS})
    service = app.extensions["provmark.generation"]
    store = app.extensions["provmark.store"]
    with serve(app) as base_url:
        yield SimpleNamespace(url=base_url, home=home, service=service, store=store,
                              admin=(home / "admin.token").read_text().strip(),
                              generate=make_token(store, "generate"), detect=make_token(store, "detect"))
    service.worker.stop()


def generate(live, body, token=None, **kwargs):
    return call("POST", live.url + "/v1/generate", body, token=token or live.generate, **kwargs)


def public_key(live) -> str:
    status, body, _ = call("GET", live.url + "/v1/receipts/public-key")
    assert status == 200 and body["algorithm"] == "Ed25519"
    return body["public_key_pem"]


def events_of(text: str) -> list:
    """The JSON data of each server-sent event ('[DONE]' stays a string)."""
    chunks = [block[len("data: "):] for block in text.split("\n\n") if block.startswith("data: ")]
    return [chunk if chunk == "[DONE]" else json.loads(chunk) for chunk in chunks]


def test_generate_returns_text_usage_watermark_and_a_verifiable_stored_receipt(live):
    status, body, _ = generate(live, {"prompt": "The river in spring", "max_new_tokens": 12, "seed": 7})
    assert status == 200, body
    assert body["finish_reason"] in ("stop", "length") and 1 <= len(body["token_ids"]) <= 12
    assert body["usage"]["completion_tokens"] == len(body["token_ids"])
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + len(body["token_ids"])
    active = live.service.keyring.active()
    assert body["watermark"]["key_id"] == active.key_id
    assert body["watermark"]["spec"] == WatermarkSpec.default().format()
    receipt = body["receipt"]
    assert receipt["text_sha256"] == text_sha256(body["text"]) and receipt["token_count"] == len(body["token_ids"])
    assert receipt["spec_fingerprint"] == body["watermark"]["spec_fingerprint"] and receipt["receipt_id"] == body["id"]
    assert body["watermark"]["fingerprint"] == body["watermark"]["spec_fingerprint"]  # the old name, one release
    assert verify_receipt(receipt, public_key(live))
    assert not verify_receipt({**receipt, "token_count": receipt["token_count"] + 1}, public_key(live))
    assert get_receipt(live.store, receipt["receipt_id"]) == receipt
    events = list_events(live.store, kind="generation", subject_id=receipt["receipt_id"])
    assert len(events) == 1 and events[0].actor.startswith("token:")
    # remembered for the detector's spoof check: the output's units are counted under its key
    memory = OutputMemory(live.store)
    assert memory.outputs(active.key_id) >= 1
    mark = Watermark(body["watermark"]["spec"], live.service.keyring.secret(active.key_id), live.service.vocab_size,
                     active.key_id)
    assert memory.counts_of(active.key_id, mark.unit_identities(body["token_ids"])).min() >= 1
    # and its 5-grams as the detector will see its text (db.output_grams), none of its prompt's
    *_, grams = memory.rows_since(active.key_id, 0, set())[-1]
    seen = text_grams(encode(live.service.engine.loaded.vocab, normalize(body["text"]).text), gram_key(live.service.keyring))
    stored = np.frombuffer(grams, dtype="<i8") if grams is not None else np.zeros(0, dtype=np.int64)
    assert set(stored.tolist()) <= set(seen.tolist()) and (grams is not None or seen.size == 0)


def test_same_seed_same_tokens_and_logprobs_per_token(live):
    body = {"prompt": "Once upon a time", "max_new_tokens": 6, "seed": 11, "logprobs": 2, "ignore_eos": True}
    first, second = generate(live, body)[1], generate(live, body)[1]
    assert first["token_ids"] == second["token_ids"] and len(first["token_ids"]) == 6
    assert [item["token_id"] for item in first["logprobs"]] == first["token_ids"]
    assert all(len(item["top_logprobs"]) == 2 and item["logprob"] <= 0 for item in first["logprobs"])


def test_watermark_off_and_chat_messages(live):
    for off in (False, None):
        status, body, _ = generate(live, {"messages": [{"role": "user", "content": "Say hello."}],
                                          "max_new_tokens": 4, "watermark": off})
        assert status == 200, body
        assert body["watermark"] is None and body["receipt"]["spec_fingerprint"] == "unwatermarked"
        assert verify_receipt(body["receipt"], public_key(live))


def test_stream_sends_deltas_then_the_receipt_then_done(live):
    status, text, headers = generate(live, {"prompt": "A short poem:", "max_new_tokens": 10, "seed": 3,
                                            "stream": True, "ignore_eos": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = events_of(text)
    assert events[-1] == "[DONE]"
    final = events[-2]
    assert final["finish_reason"] == "length" and final["usage"]["completion_tokens"] == 10
    streamed = "".join(e["delta"] for e in events[:-1])
    assert final["receipt"]["text_sha256"] == text_sha256(streamed)
    assert sum(len(e["token_ids"]) for e in events[:-1]) == 10
    assert verify_receipt(final["receipt"], public_key(live))
    plain = generate(live, {"prompt": "A short poem:", "max_new_tokens": 10, "seed": 3, "ignore_eos": True})[1]
    assert plain["text"] == streamed  # same seed, same request: streaming changes only the delivery


def test_a_stream_whose_client_leaves_is_cancelled(live):
    worker = live.service.worker
    finished_before = worker.stats()["requests_finished"]
    host, port = live.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    body = json.dumps({"prompt": "Count slowly:", "max_new_tokens": 250, "ignore_eos": True, "stream": True})
    connection.request("POST", "/v1/generate", body, {"Authorization": f"Bearer {live.generate}",
                                                      "Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.read(6) == b"data: "
    response.close()
    connection.close()
    _wait_for(lambda: worker.stats()["in_flight"] == 0 and not live.service.engine.has_unfinished())
    # cancelled, not run to its 250 tokens: it never counted as finished
    assert worker.stats()["requests_finished"] == finished_before


@pytest.mark.parametrize("body, field", [
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),  # SamplingParams' own rule
    ({"prompt": "x", "logit_bias": {"99999999": 1.0}}, "logit_bias"),  # beyond the vocabulary
    ({"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    ({"prompt": "x", "watermark": "kgw:gamma=2"}, "watermark"),
    ({"prompt": "x", "key_id": "Not A Key Id"}, "key_id"),
    ({"prompt": "x", "sampler": "typo"}, "sampler"),
    ({"max_new_tokens": 3}, "prompt"),
    ({"prompt": [1, 2, 10**7]}, "prompt"),
])
def test_bad_fields_are_422_naming_the_field(live, body, field):
    status, answer, _ = generate(live, body)
    assert status == 422, answer
    assert field in {d["field"].split(".")[0] for d in answer["error"]["details"]}


def test_request_errors(live):
    assert generate(live, None, raw=b"{not json")[0] == 400
    assert generate(live, None, raw=b"[1, 2]")[0] == 400
    assert call("POST", live.url + "/v1/generate", {"prompt": "x"})[0] == 401
    assert generate(live, {"prompt": "x"}, token="pmk_" + "A" * 43)[0] == 401
    status, body, _ = generate(live, {"prompt": "x"}, token=live.detect)
    assert status == 403 and "generate" in body["error"]["message"]
    status, body, _ = generate(live, {"prompt": "x", "key_id": "k-missing"})
    assert status == 404 and body["error"]["code"] == "key_not_found"
    status, body, _ = generate(live, {"prompt": "y" * (MAX_TEXT_CHARS + 1)})
    assert status == 413 and body["error"]["code"] == "too_large" and body["error"]["param"] == "prompt"
    assert body["error"]["details"][0]["limit"] == MAX_TEXT_CHARS
    status, body, _ = generate(live, {"prompt": "word " * 390, "max_new_tokens": 2})  # 1950 chars, 390 tokens > max_model_len
    assert status == 422 and body["error"]["details"][0]["field"] == "prompt"


def test_concurrent_requests_share_engine_steps(live):
    worker = live.service.worker
    results = [None] * CONCURRENT

    def one(i):
        results[i] = generate(live, {"prompt": f"Request number {i} says", "max_new_tokens": 8, "seed": i,
                                     "ignore_eos": True})

    with worker.held():  # line the requests up so they start in the same step, whatever the timing
        threads = [threading.Thread(target=one, args=(i,)) for i in range(CONCURRENT)]
        for t in threads:
            t.start()
        _wait_for(lambda: worker.waiting_requests() == CONCURRENT)
    for t in threads:
        t.join(120)
    assert [r[0] for r in results] == [200] * CONCURRENT
    assert all(len(r[1]["token_ids"]) == 8 for r in results)
    status, health, _ = call("GET", live.url + "/healthz")
    assert status == 200 and health["status"] == "ok"
    assert health["engine"]["max_batch_size"] >= CONCURRENT and health["engine"]["shared_steps"] >= 1


def _wait_for(condition, attempts: int = 600) -> None:
    event = threading.Event()
    for _ in range(attempts):
        if condition():
            return
        event.wait(0.05)
    raise AssertionError("condition not reached")


def test_defaults_match_sampling_params():
    from api.generation.routes_native import DIRECT_FIELDS, GenerateRequest

    defaults = SamplingParams()
    for name in DIRECT_FIELDS:
        assert GenerateRequest.model_fields[name].default == getattr(defaults, name), name


def test_health_public_key_models_and_openapi(live):
    status, health, _ = call("GET", live.url + "/healthz")
    assert status == 200 and health["max_num_seqs"] == 8
    pem = public_key(live)
    assert pem.startswith("-----BEGIN PUBLIC KEY-----")
    status, models, _ = call("GET", live.url + "/v1/models", token=live.generate)
    assert status == 200 and models["object"] == "list" and models["data"][0]["id"] == live.service.model_id
    with urllib.request.urlopen(live.url + "/openapi.json", timeout=30) as response:
        document = json.load(response)
    paths = document["paths"]
    assert {"/v1/generate", "/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz",
            "/v1/receipts/public-key"} <= set(paths)
    assert "text/event-stream" in paths["/v1/generate"]["post"]["responses"]["200"]["content"]
    assert paths["/v1/generate"]["post"]["x-required-scope"] == "generate"
    limits = document["components"]["schemas"]["GenerateRequest"]["properties"]["max_new_tokens"]
    assert limits["maximum"] == 2048


def test_one_vocabulary_and_the_old_spellings_for_one_release(live):
    base = {"prompt": "The lighthouse", "max_new_tokens": 4, "temperature": 0}
    status, off, headers = generate(live, {**base, "watermark": "off"})
    assert status == 200 and off["watermark"] is None and "Deprecation" not in headers
    status, old_off, headers = generate(live, {**base, "watermark": None})
    assert status == 200 and old_off["watermark"] is None and headers["Deprecation"] == "true"
    assert '"off"' in headers["Warning"]
    key = live.service.keyring.active().key_id
    status, keyed, headers = generate(live, {**base, "temperature": 1.0, "seed": 1, "keys": [key]})
    assert status == 200 and keyed["watermark"]["key_id"] == key and "Deprecation" not in headers
    status, old_keyed, headers = generate(live, {**base, "temperature": 1.0, "seed": 1, "key_id": key})
    assert status == 200 and old_keyed["token_ids"] == keyed["token_ids"] and "key_id" in headers["Warning"]
    status, both, _ = generate(live, {**base, "keys": [key], "key_id": key})
    assert status == 422 and both["error"]["param"] == "key_id"
    status, two, _ = generate(live, {**base, "keys": [key, key]})
    assert status == 422 and two["error"]["param"].startswith("keys")
    status, _, headers = call("GET", live.url + "/v1/receipts/public-key")
    assert status == 200 and headers["Deprecation"] == "true"


def test_answers_carry_the_detectors_security_headers(live):
    from api.limits import PAGE_CSP

    for path in ("/healthz", "/openapi.json", "/docs", "/.well-known/jwks.json", "/v1/receipts/public-key"):
        status, _, headers = call("GET", live.url + path)
        assert status == 200, path
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer", path
    assert call("GET", live.url + "/docs")[2]["Content-Security-Policy"] == PAGE_CSP
    status, _, headers = generate(live, {"prompt": ""})  # errors too
    assert status == 422 and headers["X-Content-Type-Options"] == "nosniff"


@pytest.fixture(scope="module")
def limited(live, loaded):
    """A second process of the same service (same home: its key is screened already) with a rate limit of 60 a
    minute, 2 at once, and its own limit tables."""
    from generation.engine import Engine

    engine = Engine(loaded, max_num_seqs=2, max_model_len=64)
    app = create_app({"home": live.home, "engine": engine, "rate_limit": 60, "rate_burst": 2,
                      "max_text_chars": MAX_TEXT_CHARS})
    with serve(app) as base_url:
        yield base_url
    app.extensions["provmark.generation"].worker.stop()


@pytest.mark.parametrize("path", ["/.well-known/jwks.json", "/v1/c2pa/trust-anchors", "/openapi.json",
                                  "/v1/receipts/public-key"])
def test_anonymous_routes_are_rate_limited_per_address(limited, path):
    statuses = []
    for _ in range(4):
        status, _, headers = call("GET", limited + path)
        statuses.append(status)
    assert statuses[-1] == 429 and 1 <= int(headers["Retry-After"]) <= 60
    assert 200 in statuses or path != "/.well-known/jwks.json"  # the first route tried still had its burst
    assert call("GET", limited + "/healthz")[0] == 200  # probes are never limited


def test_bad_tokens_in_a_row_get_429_and_an_audit_event(limited, live):
    from api.http import THROTTLED_EVENT

    before = len(list_events(live.store, kind=THROTTLED_EVENT))
    statuses = [generate(SimpleNamespace(url=limited), {"prompt": "x"}, token=f"pmk_{i:02d}" + "G" * 41)[0]
                for i in range(12)]
    assert statuses == [401] * 5 + [429] * 7
    events = list_events(live.store, kind=THROTTLED_EVENT)[before:]
    assert [e.details["throttled"] for e in events] == ["address"]
