"""``make serve``: both services on 127.0.0.1 (generation :8000, detector :8001) as child processes.

Prints where they are and how to get the admin token once both answer /healthz; Ctrl-C or SIGTERM
stops both (the signal is forwarded), and if one service exits the other is stopped too.

    python -m api.serve_all [--host H] [--generation-port P] [--detector-port P]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from watermark.paths import provmark_home

READY_TIMEOUT_S = 300.0  # the first start converts the embedded model (~15 s) and loads it; slow disks take longer
POLL_INTERVAL_S = 0.5
STOP_TIMEOUT_S = 40.0  # beyond the generation server's graceful timeout (30 s)


def service_command(service: str, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", "api.cli", "serve", service, "--host", host, "--port", str(port)]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop_all(children: dict[str, subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to every child still running, wait, and kill those that outlive STOP_TIMEOUT_S."""
    for child in children.values():
        if child.poll() is None:
            child.send_signal(sig)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for child in children.values():
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m api.serve_all", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--generation-port", type=int, default=8000)
    parser.add_argument("--detector-port", type=int, default=8001)
    args = parser.parse_args(argv)

    urls = {"generation": f"http://{args.host}:{args.generation_port}",
            "detector": f"http://{args.host}:{args.detector_port}"}
    ports = {"generation": args.generation_port, "detector": args.detector_port}
    children: dict[str, subprocess.Popen] = {}
    stopping = False

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for name in ("detector", "generation"):  # the detector starts faster: it loads no model
        children[name] = subprocess.Popen(service_command(name, args.host, ports[name]))
    print(f"provmark: starting the detector ({urls['detector']}) and the generation service "
          f"({urls['generation']}, loading the model)...", flush=True)

    announced = False
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while not stopping:
            exited = {name: child.returncode for name, child in children.items() if child.poll() is not None}
            if exited:
                for name, code in exited.items():
                    print(f"provmark: the {name} service exited (status {code}); stopping the other", file=sys.stderr)
                return max(code or 1 for code in exited.values())
            if not announced and all(healthy(url) for url in urls.values()):
                announce(urls)
                announced = True
            elif not announced and time.monotonic() > deadline:
                print(f"provmark: the services did not answer /healthz within {READY_TIMEOUT_S:.0f} s", file=sys.stderr)
                return 1
            time.sleep(POLL_INTERVAL_S)
        return 0
    finally:
        print("provmark: stopping both services...", file=sys.stderr, flush=True)
        stop_all(children)


def announce(urls: dict[str, str]) -> None:
    token_file = provmark_home() / "admin.token"
    print(flush=True)
    print(f"  generation  {urls['generation']}   POST /v1/generate, OpenAI base_url {urls['generation']}/v1", flush=True)
    print(f"  detector    {urls['detector']}   paste page {urls['detector']}/, POST /v1/detect", flush=True)
    print(f"  API docs    {urls['generation']}/openapi.json  {urls['detector']}/openapi.json", flush=True)
    print(f"  admin token printed above on first start; always in {token_file} (`cat {token_file}`)", flush=True)
    print("  scoped tokens: provmark tokens create --scopes generate detect --name me", flush=True)
    print("  Ctrl-C stops both.", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
