"""GET /metrics of both services over real HTTP: request counts and latencies per route and status,
verdicts by verdict, engine occupancy / queue depth / tokens, per-app registries, the optional token."""

import threading
import time
from types import SimpleNamespace

import pytest
from http_fixtures import (
    call,
    human_text,
    make_token,
    serve,
    shared_vocabulary,
    watermarked_text,
)
from prometheus_client.parser import text_string_to_metric_families

from api.detector.app import create_app, services_of
from watermark.keys import Keyring

KEY = "k-metrics"


def scrape(base_url: str, token: str | None = None) -> dict:
    """{(sample name, sorted label items): value} of one scrape."""
    status, body, headers = call("GET", base_url + "/metrics", headers={"Authorization": f"Bearer {token}"}
                                 if token else None)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def detector_service(provmark_home):
    ring = Keyring(provmark_home)
    ring.create(KEY)
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    store = services_of(app).store
    with serve(app) as base_url:
        yield SimpleNamespace(url=base_url, store=store, token=make_token(store, "detect"), ring=ring)
    store.close()


def test_detector_counts_requests_latencies_and_verdicts(detector_service):
    svc = detector_service
    human = human_text(1200)
    marked = watermarked_text(shared_vocabulary(), svc.ring.secret(KEY), human, max_tokens=160)
    answers = [call("POST", svc.url + "/v1/detect", {"text": text}, token=svc.token)[1]["verdict"]
               for text in (marked, human, marked, "")]
    assert answers == ["watermarked", "not_watermarked", "watermarked", "insufficient_text"]
    call("POST", svc.url + "/v1/detect", {"text": "x"})  # no token: 401
    call("GET", svc.url + "/no/such/page")
    call("GET", svc.url + f"/v1/verdicts/{'0' * 8}", token=svc.token)  # wrong scope: 403

    samples = scrape(svc.url)
    service = "provmark-detector"
    detect = {"service": service, "route": "/v1/detect", "method": "POST"}
    assert value(samples, "provmark_http_requests_total", status="200", **detect) == 4
    assert value(samples, "provmark_http_requests_total", status="401", **detect) == 1
    assert value(samples, "provmark_http_requests_total", service=service, route="<unmatched>", method="GET",
                 status="404") == 1
    # the route label is the URL rule, never the raw path with its id
    assert value(samples, "provmark_http_requests_total", service=service, route="/v1/verdicts/<verdict_id>",
                 method="GET", status="403") == 1
    assert value(samples, "provmark_http_request_duration_seconds_count", **detect) == 5
    assert value(samples, "provmark_http_request_duration_seconds_bucket", le="+Inf", **detect) == 5
    assert value(samples, "provmark_http_request_duration_seconds_sum", **detect) > 0
    assert value(samples, "provmark_verdicts_total", verdict="watermarked") == 2
    assert value(samples, "provmark_verdicts_total", verdict="not_watermarked") == 1
    assert value(samples, "provmark_verdicts_total", verdict="insufficient_text") == 1
    # the scrape leaks no text, key id or token
    _, body, _ = call("GET", svc.url + "/metrics")
    assert KEY not in body and svc.token not in body and human[:40] not in body


def test_each_app_has_its_own_registry(detector_service, provmark_home):
    svc = detector_service
    call("GET", svc.url + "/healthz")
    other = create_app({"home": provmark_home, "vocab": shared_vocabulary()})
    with serve(other) as other_url:
        call("GET", other_url + "/healthz")
        call("GET", other_url + "/healthz")
        assert value(scrape(other_url), "provmark_http_requests_total", service="provmark-detector",
                     route="/healthz", method="GET", status="200") == 2
    assert value(scrape(svc.url), "provmark_http_requests_total", service="provmark-detector", route="/healthz",
                 method="GET", status="200") == 1
    services_of(other).store.close()


def test_metrics_token_is_optional(detector_service, monkeypatch):
    monkeypatch.setenv("PROVMARK_METRICS_TOKEN", "scrape-secret")
    status, _, headers = call("GET", detector_service.url + "/metrics")
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert call("GET", detector_service.url + "/metrics", token="wrong")[0] == 401
    assert "provmark_http_requests_total" in str(scrape(detector_service.url, token="scrape-secret"))


def test_multiprocess_mode_sums_files_of_every_worker(tmp_path, monkeypatch, detector_service):
    """With PROMETHEUS_MULTIPROC_DIR, the scrape reads the per-process files (what gunicorn workers share)."""
    import prometheus_client.values
    from prometheus_client import multiprocess

    from api.metrics import ServiceMetrics

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(prometheus_client.values, "ValueClass", prometheus_client.values.MultiProcessValue())
    first = ServiceMetrics("svc")
    first.requests.labels("svc", "/x", "GET", "200").inc(3)
    text = first.render().decode()
    assert 'provmark_http_requests_total{method="GET",route="/x",service="svc",status="200"} 3.0' in text
    multiprocess.mark_process_dead(0, str(tmp_path))  # harmless: no live gauges


# ---- the generation service ---------------------------------------------------------------------


@pytest.mark.slow  # loads the embedded model
def test_generation_engine_gauges_and_tokens(tmp_path, loaded):
    from api.generation.app import create_app as create_generation_app
    from generation.engine import Engine

    home = tmp_path / "generation-home"
    engine = Engine(loaded, max_num_seqs=4, max_model_len=128)
    app = create_generation_app({"home": home, "engine": engine, "rate_limit": 0})
    worker = app.extensions["provmark.generation"].worker
    token = make_token(app.extensions["provmark.store"], "generate")
    try:
        with serve(app) as base_url:
            answers = []

            def generate(seed: int) -> None:
                answers.append(call("POST", base_url + "/v1/generate",
                                    {"prompt": "The river in spring", "max_new_tokens": 6, "seed": seed},
                                    token=token))

            with worker.held():  # both requests queue; no step runs until the block ends
                threads = [threading.Thread(target=generate, args=(seed,)) for seed in (1, 2)]
                for thread in threads:
                    thread.start()
                _wait_for(lambda: worker.waiting_requests() == 2)
                held = scrape(base_url)
                assert value(held, "provmark_engine_waiting_requests") == 2
                assert value(held, "provmark_engine_running_sequences") == 0
            for thread in threads:
                thread.join(timeout=120)
            assert [status for status, _, _ in answers] == [200, 200], answers
            done = scrape(base_url)
            produced = sum(body["usage"]["completion_tokens"] for _, body, _ in answers)
            assert value(done, "provmark_engine_tokens_generated_total") == produced > 0
            assert value(done, "provmark_engine_waiting_requests") == 0
            assert value(done, "provmark_engine_running_sequences") == 0
            assert value(done, "provmark_http_requests_total", service="provmark-generation", route="/v1/generate",
                         method="POST", status="200") == 2
            assert value(done, "provmark_http_request_duration_seconds_count", service="provmark-generation",
                         route="/v1/generate", method="POST") == 2
    finally:
        worker.stop()


def _wait_for(condition, attempts: int = 600) -> None:
    for _ in range(attempts):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")
