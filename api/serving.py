"""How both services are served: gunicorn as the process manager and its asyncio worker reading
requests; the generation app runs on a thread pool behind a2wsgi, the detector app on the worker's
own thread once its request has fully arrived (``InlineWSGI``).

Why this layer (measured in docs/deploy.md): gunicorn's ``sync`` and ``gthread`` workers
give a connection a thread as soon as its first bytes arrive and then block that thread in the header
parser, so a few clients that send half a request and wait stop a service (2 such connections held the
detector for 120 s; 64 held the generation service). gunicorn's ``asgi`` worker parses on an event
loop instead: a half-sent request costs a buffer, not a thread, and the app only runs once a request is
complete. For the generation service a2wsgi (maintained, used by Starlette's ecosystem) adapts the
WSGI app: a bounded thread pool runs it, the request body reaches it as a stream (so Flask's MAX_CONTENT_LENGTH answers a JSON
413 from Content-Length before reading the body, and a chunked body stops at the limit), and response
chunks are sent as they come (server-sent events stream).

What gunicorn answers itself before the app sees a request (a request line past 8190 bytes, too
many or too large headers, a malformed request) is a JSON error body here too, like every other error.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
from http import HTTPStatus
from io import BytesIO

from api.http import error_body

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus-client when it is imported (api.metrics)

KEEPALIVE_S = 5  # an idle kept-alive connection is closed after this long
LIMIT_REQUEST_LINE = 8190  # gunicorn's largest: a verdict id of thousands of characters still gets a JSON 404
WORKER_CLASS = "api.serving.JSONErrorASGIWorker"


def asgi_app(wsgi_app, threads: int):
    """``wsgi_app`` as an ASGI app whose requests run on ``threads`` threads."""
    from a2wsgi import WSGIMiddleware  # noqa: PLC0415 (the server stack loads where a server starts, not with the CLI)

    return WSGIMiddleware(wsgi_app, workers=threads)


class InlineWSGI:
    """The detector's ASGI app: the request body is received on the event loop (a slow client costs a
    buffer, never a thread), then the WSGI app runs on the loop's own thread and its answer is sent.

    Measured with benchmarks/service_load.py (16 clients, 300-token texts, 2 workers, metrics per worker):
    gunicorn's sync worker 366-377 requests/s; a2wsgi's thread pool 210-260 with 32 threads (scoring
    holds the GIL: threads only contend) and ~320 with one; this 359 (p99 68 ms). Scoring blocks the loop for its few
    milliseconds, exactly as a sync worker is blocked, but only once a request is complete. Bodies larger
    than ``body_limit`` are not received: the app answers 413 from the Content-Length header. Responses
    are built whole (the detector streams nothing); environ building is a2wsgi's."""

    def __init__(self, app, body_limit: int) -> None:
        self.app, self.body_limit = app, body_limit
        self.fallback = asgi_app(app, threads=1)  # lifespan and anything but plain HTTP

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.fallback(scope, receive, send)
        from a2wsgi.wsgi import build_environ  # noqa: PLC0415 (the server stack loads where a server starts)

        length = next((value for name, value in scope["headers"] if name == b"content-length"), b"0")
        received, size = [], 0
        more = (int(length) <= self.body_limit) if length.isdigit() else True
        while more:  # a body without Content-Length (chunked) is cut past the limit: the app refuses it
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            received.append(message.get("body", b""))
            size += len(received[-1])
            more = message.get("more_body", False) and size <= self.body_limit
        state, written = {}, []

        def start_response(status, headers, exc_info=None):
            state["status"], state["headers"] = status, headers
            return written.append

        result = self.app(build_environ(scope, BytesIO(b"".join(received))), start_response)
        try:
            body = b"".join(written) + b"".join(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        await send({"type": "http.response.start", "status": int(state["status"][:3]),
                    "headers": [(name.lower().encode("latin-1"), value.encode("latin-1"))
                                for name, value in state["headers"]]})
        await send({"type": "http.response.body", "body": body})


def gunicorn_options(host: str, port: int, workers: int, *, timeout: int, graceful_timeout: int,
                     proc_name: str) -> dict:
    """The gunicorn settings both services share."""
    return {"bind": f"{host}:{port}", "workers": workers, "worker_class": WORKER_CLASS,
            "timeout": timeout, "graceful_timeout": graceful_timeout, "keepalive": KEEPALIVE_S,
            "limit_request_line": LIMIT_REQUEST_LINE, "accesslog": None, "errorlog": "-",
            "loglevel": "warning", "proc_name": proc_name, "asgi_lifespan": "off",
            # gunicorn's control socket is one fixed path per user: several servers would collide on it.
            "control_socket_disable": True,
            "child_exit": _mark_worker_dead}


def run_gunicorn(load, host: str, port: int, workers: int, *, timeout: int, graceful_timeout: int, proc_name: str,
                 **extra) -> None:
    """The one launcher of both services: gunicorn in this process with ``gunicorn_options`` (plus ``extra``
    settings, e.g. ``post_fork``), serving the app ``load()`` returns, until stopped. Settings this
    gunicorn version lacks are skipped (``control_socket_disable`` exists from gunicorn 27 on)."""
    from gunicorn.app.base import BaseApplication  # noqa: PLC0415 (the server stack loads where a server starts)

    options = {**gunicorn_options(host, port, workers, timeout=timeout, graceful_timeout=graceful_timeout,
                                  proc_name=proc_name), **extra}

    class Server(BaseApplication):
        def load_config(self):
            for key, value in options.items():
                if key in self.cfg.settings:
                    self.cfg.set(key, value)

        def load(self):
            return load()

    Server().run()


def prepare_metrics_dir(workers: int) -> str | None:
    """PROMETHEUS_MULTIPROC_DIR for this server's workers, so /metrics sums over all of them: the
    operator's folder when set (emptied: stale files would add old counts), else, with more than one
    worker, a private temporary one removed at exit. Must run before the app makes its metrics.

    The sum has a price: prometheus-client's multiprocess mode writes every count to a shared file,
    measured at 359 -> ~310 detections/s with 16 clients of 300-token texts on 2 workers (2 cores). One
    worker (the generation service's default) needs no sum and does not pay it."""
    path = os.environ.get(MULTIPROC_ENV)
    if not path and workers <= 1:
        return None
    if path:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name.endswith(".db"):
                os.remove(os.path.join(path, name))
    else:
        path = tempfile.mkdtemp(prefix="provmark-metrics-")
        os.environ[MULTIPROC_ENV] = path
        atexit.register(shutil.rmtree, path, True)
    values = sys.modules.get("prometheus_client.values")
    if values is not None:  # imported already: metrics made from now on must use the shared files too
        values.ValueClass = values.get_value_class()
    return path


def _mark_worker_dead(_server, worker) -> None:
    """A worker that exited stops counting towards live gauges (its counters stay in the sum)."""
    if os.environ.get(MULTIPROC_ENV):
        # prometheus-client picks its value class when first imported: never before prepare_metrics_dir
        from prometheus_client import multiprocess  # noqa: PLC0415 (import order: see the line above)

        multiprocess.mark_process_dead(worker.pid)


def _json_error_protocol():
    from gunicorn.asgi.protocol import ASGIProtocol  # noqa: PLC0415 (gunicorn imports the worker class lazily)

    class JSONErrorProtocol(ASGIProtocol):
        """gunicorn's own early answers (414, 431, 400, 501) with the services' JSON error body."""

        def _send_error_response(self, status, message, extra_headers=()):
            try:
                phrase = HTTPStatus(status).phrase
            except ValueError:
                phrase = "Error"
            code = phrase.lower().replace(" ", "_").replace("-", "_")
            body = json.dumps(error_body(status, code, f"{phrase.lower()}: the request was refused before it "
                                                       "reached the service")).encode()
            head = (f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    + "".join(f"{name}: {value}\r\n" for name, value in extra_headers)
                    + "Connection: close\r\n\r\n")
            self._safe_write(head.encode("latin-1"))
            self._safe_write(body)

    return JSONErrorProtocol


def _worker_class():
    import gunicorn.workers.gasgi as gasgi  # noqa: PLC0415 (gunicorn imports the worker class lazily)

    class JSONErrorASGIWorker(gasgi.ASGIWorker):
        def init_process(self):
            # The worker module builds its connections through this name; in this worker process only.
            gasgi.ASGIProtocol = _json_error_protocol()
            super().init_process()

    return JSONErrorASGIWorker


def __getattr__(name: str):
    if name == "JSONErrorASGIWorker":  # imported by gunicorn from WORKER_CLASS, in the master, lazily
        cls = _worker_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
