"""``provmark serve generation|detector [--host H] [--port P] [--workers N]``: run one service.

generation (default 127.0.0.1:8000): gunicorn workers (api/serving.py: an event loop reads requests,
a thread pool runs the app); each worker process loads the model once and runs one engine, so
``--workers`` above 1 multiplies memory (default 1) and ``--threads`` bounds the requests a worker
runs at once (streams hold a thread each).
detector (default 127.0.0.1:8001): gunicorn with ``--workers`` processes (no model weights).
Both read their configuration from the PROVMARK_* environment variables (api/settings.py); on first start the
first of them writes a bootstrap admin token to $PROVMARK_HOME/admin.token (shown once on a terminal, never in a
log).
"""

from __future__ import annotations

import argparse
import os

from api.cli.errors import CLIError
from api.serving import asgi_app, prepare_metrics_dir, run_gunicorn
from provenance.identity import IdentityError

DEFAULTS = {"generation": {"port": 8000, "workers": 1}, "detector": {"port": 8001, "workers": 2}}
DEFAULT_HOST = "127.0.0.1"
GENERATION_THREADS = 96  # concurrent requests per worker: > max_num_seqs, so the engine batch can fill
GENERATION_GRACEFUL_TIMEOUT_S = 30  # lets running generations finish on SIGTERM
GENERATION_WORKER_TIMEOUT_S = 120  # a worker whose main loop is silent this long is restarted (not per request)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="run the generation or the detector service",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("service", choices=sorted(DEFAULTS), help="which service to run")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, help="port (default: generation 8000, detector 8001)")
    p.add_argument("--workers", type=int, help="worker processes (default: generation 1, detector 2)")
    p.add_argument("--threads", type=int, default=GENERATION_THREADS,
                   help=f"generation only: request threads per worker (default {GENERATION_THREADS})")
    p.set_defaults(func=run)


def run(args) -> int:
    port = args.port if args.port is not None else DEFAULTS[args.service]["port"]
    workers = args.workers if args.workers is not None else DEFAULTS[args.service]["workers"]
    if not 0 <= port <= 65535:
        raise CLIError(f"--port: expected 0..65535, got {port}")
    if workers < 1:
        raise CLIError(f"--workers: expected at least 1, got {workers}")
    if args.threads < 1:
        raise CLIError(f"--threads: expected at least 1, got {args.threads}")
    try:
        if args.service == "detector":
            from api.detector.wsgi import run_detector_server  # noqa: PLC0415 (Flask and the app load for `serve` only)

            run_detector_server(args.host, port, workers)
        else:
            run_generation_server(args.host, port, workers, args.threads)
    except (OSError, ValueError, IdentityError) as exc:  # a bad setting, or an identity not the database's
        raise CLIError(str(exc)) from None
    return 0


def run_generation_server(host: str, port: int, workers: int = 1, threads: int = GENERATION_THREADS) -> None:
    """Serve the generation app with gunicorn until stopped. The app (model, engine thread) is built
    in each worker after the fork: threads do not survive a fork."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer pool across the fork
    prepare_metrics_dir(workers)  # /metrics sums over the workers

    def load():
        from api.generation.app import create_app  # noqa: PLC0415 (transformers, Flask and the app load in the worker)

        return asgi_app(create_app(), threads=threads)

    print(f"provmark generation: serving on http://{host}:{port}/ (OpenAI base_url http://{host}:{port}/v1) "
          f"with {workers} worker(s) x {threads} threads; the model loads in each worker", flush=True)
    run_gunicorn(load, host, port, workers, timeout=GENERATION_WORKER_TIMEOUT_S,
                 graceful_timeout=GENERATION_GRACEFUL_TIMEOUT_S, proc_name="provmark-generation")
