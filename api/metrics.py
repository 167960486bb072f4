"""Prometheus ``GET /metrics`` for both services (prometheus-client text format).

Series (every app gets its own ``CollectorRegistry``, so many apps can live in one process):

    provmark_http_requests_total{service, route, method, status}          counter
    provmark_http_request_duration_seconds{service, route, method}        histogram (until the response
                                                                           is handed to the server: for a
                                                                           stream, time to its first byte)
    provmark_verdicts_total{verdict}                                      detector: 200 answers of /v1/detect
    provmark_engine_running_sequences                                     generation: sequences in the batch
    provmark_engine_waiting_requests                                      generation: accepted, not yet running
    provmark_engine_tokens_generated_total                                generation: tokens sampled so far

``route`` is the URL rule (``/v1/verdicts/<verdict_id>``), never the raw path, so ids do not explode
the label space; requests that match no route count as ``<unmatched>``.

Several gunicorn workers: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder writable by the
workers (wiped before each start) and every counter and histogram is written there, so one scrape sees
the sum over workers (prometheus-client's multiprocess mode). The engine gauges are read from the
engine at scrape time; the generation service runs one process, so they need no aggregation.

Access: ``/metrics`` needs no token by default. It exposes request counts and latencies per route,
verdict totals and engine queue sizes: no text, no key id, no token and no secret, so an attacker
learns at most the traffic volume. Typical deployments scrape it on an internal network; to require a
token anyway, set ``PROVMARK_METRICS_TOKEN`` and scrape with ``Authorization: Bearer <that value>``
(compared in constant time; it is not an API token and carries no scope).
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Callable

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

METRICS_PATH = "/metrics"
METRICS_TOKEN_ENV = "PROVMARK_METRICS_TOKEN"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNMATCHED_ROUTE = "<unmatched>"
EXTENSION = "provmark.metrics"
# Latency buckets (seconds): a cached detection takes ~1 ms, a 64-token generation on CPU seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServiceMetrics:
    """The metric objects of one app and the registry ``/metrics`` renders."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("provmark_http_requests_total", "HTTP requests answered, by route and status",
                                ["service", "route", "method", "status"], registry=self.registry)
        self.latency = Histogram("provmark_http_request_duration_seconds",
                                 "Seconds from request start to response (streams: to the first byte)",
                                 ["service", "route", "method"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.verdicts = Counter("provmark_verdicts_total", "Verdicts answered by /v1/detect, by verdict",
                                ["verdict"], registry=self.registry)
        self._live: list = []  # collectors read at scrape time (per process)

    def __repr__(self) -> str:
        return f"ServiceMetrics({self.service!r})"

    def add_live_collector(self, collector) -> None:
        """A collector read at scrape time in this process (engine gauges)."""
        self.registry.register(collector)
        self._live.append(collector)

    def render(self) -> bytes:
        """The text exposition: this registry, or in multiprocess mode the sum over every worker."""
        if not os.environ.get(MULTIPROC_ENV):
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)
        for collector in self._live:
            merged.register(collector)
        return generate_latest(merged)


def install_metrics(app: Flask, service: str) -> ServiceMetrics:
    """Count and time every request of ``app`` and serve ``GET /metrics``; returns the metrics."""
    metrics = ServiceMetrics(service)
    app.extensions[EXTENSION] = metrics

    @app.before_request
    def _start_timer():
        g.metrics_started = time.perf_counter()

    @app.after_request
    def _count(response):
        started = g.pop("metrics_started", None)
        route = request.url_rule.rule if request.url_rule is not None else UNMATCHED_ROUTE
        metrics.requests.labels(service, route, request.method, str(response.status_code)).inc()
        if started is not None:
            metrics.latency.labels(service, route, request.method).observe(time.perf_counter() - started)
        return response

    def serve_metrics():
        expected = os.environ.get(METRICS_TOKEN_ENV)
        if expected and not _bearer_matches(request.headers.get("Authorization", ""), expected):
            return Response("metrics token required\n", status=401, mimetype="text/plain",
                            headers={"WWW-Authenticate": "Bearer"})
        return Response(metrics.render(), mimetype=None, content_type=CONTENT_TYPE_LATEST)

    app.add_url_rule(METRICS_PATH, endpoint="prometheus_metrics", view_func=serve_metrics, methods=["GET"])
    return metrics


def count_verdict(metrics: ServiceMetrics, response) -> None:
    """After a 200 from /v1/detect: count its verdict (read from the JSON answer)."""
    if response.status_code != 200 or not response.is_json:
        return
    body = response.get_json(silent=True)
    verdict = body.get("verdict") if isinstance(body, dict) else None
    if isinstance(verdict, str):
        metrics.verdicts.labels(verdict).inc()


class EngineCollector:
    """Engine gauges read at scrape time: ``occupancy() -> (running, waiting)`` and ``stats()``."""

    def __init__(self, occupancy: Callable[[], tuple[int, int]], stats: Callable[[], dict]) -> None:
        self._occupancy = occupancy
        self._stats = stats

    def describe(self):
        return []  # no fixed description: collect() is cheap, and the registry may call it any time

    def collect(self):
        running, waiting = self._occupancy()
        yield GaugeMetricFamily("provmark_engine_running_sequences", "Sequences in the engine's running batch",
                                value=running)
        yield GaugeMetricFamily("provmark_engine_waiting_requests",
                                "Requests accepted and not yet running (queue depth)", value=waiting)
        yield CounterMetricFamily("provmark_engine_tokens_generated", "Tokens the engine has generated",
                                  value=self._stats().get("tokens_generated", 0))


def _bearer_matches(header: str, expected: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), expected.encode())
