"""Entry points of the detector: ``application`` (WSGI), ``asgi_application`` (the same app behind
a2wsgi, for ``gunicorn -k api.serving.JSONErrorASGIWorker api.detector.wsgi:asgi_application``, the
layout ``provmark serve detector`` runs: see api/serving.py), or
``python -m api.detector.wsgi [--host H] [--port P] [--workers N]`` (gunicorn, N worker processes).

``run_detector_server`` builds the app once in the gunicorn master (migrations, the bootstrap admin
token, the tokenizer) and forks the workers from it, so they start at once and share the tokenizer's
memory; each worker drops the database connections it inherited and opens its own.
"""

from __future__ import annotations

import argparse
import os

from api.detector.app import create_app, services_of
from api.serving import InlineWSGI, prepare_metrics_dir, run_gunicorn

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8001
DEFAULT_WORKERS = 2
WORKER_TIMEOUT_S = 120  # a 100,000-character text scores in about a second; this only catches hangs
GRACEFUL_TIMEOUT_S = 10

_application = None


def __getattr__(name: str):
    """``application`` is built on first access (importing this module builds no app, opens no database)."""
    global _application
    if name == "application":
        if _application is None:
            _application = create_app()
        return _application
    if name == "asgi_application":
        app = __getattr__("application")
        return InlineWSGI(app, app.config["MAX_CONTENT_LENGTH"])
    raise AttributeError(name)


def run_detector_server(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, workers: int = DEFAULT_WORKERS) -> None:
    """Serve the detector with gunicorn on ``host:port`` with ``workers`` processes until stopped."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port: expected 0..65535, got {port!r}")
    # Tokenizer threads must not be running when gunicorn forks the workers.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    prepare_metrics_dir(workers)  # before the app makes its metrics: /metrics sums over the workers
    app = create_app()
    services_of(app).store.engine.dispose()  # no connection of the master's is shared with a worker
    served = InlineWSGI(app, app.config["MAX_CONTENT_LENGTH"])

    def post_fork(_server, _worker):
        import torch

        torch.set_num_threads(1)  # one scoring at a time per worker: a thread pool only adds contention
        services_of(app).store.engine.dispose(close=False)

    print(f"provmark detector: serving on http://{host}:{port}/ with {workers} workers", flush=True)
    run_gunicorn(lambda: served, host, port, workers, timeout=WORKER_TIMEOUT_S, graceful_timeout=GRACEFUL_TIMEOUT_S,
                 proc_name="provmark-detector", post_fork=post_fork)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.detector.wsgi", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    args = parser.parse_args(argv)
    run_detector_server(args.host, args.port, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
