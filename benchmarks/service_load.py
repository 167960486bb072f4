"""Load on both services over HTTP: requests/s and p50/p99 latency of POST /v1/detect and POST /v1/generate.

Starts the detector and the generation service as subprocesses (``provmark serve ...``) on free
loopback ports with a temporary PROVMARK_HOME (the converted model cache is reused), then drives
each with ``--concurrency`` client threads:

- /v1/detect: human texts of ``--detect-tokens`` tokens (gensim's lee_background.cor news corpus,
  located through importlib.metadata), ``--detect-requests`` requests;
- /v1/generate: ``--new-tokens`` new tokens each (ignore_eos, so every request generates exactly that
  many; default watermark), ``--generate-requests`` requests.

Latency is per request, from send to the whole answer read; requests/s = requests / wall time of
the phase. Writes benchmarks/results/service_load.json.

    python benchmarks/service_load.py [--detect-requests 400] [--generate-requests 48] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from watermark.paths import models_dir
from watermark.vocab import encode, load_vocabulary

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, write_json

HUMAN_CORPUS = "gensim/test/test_data/lee_background.cor"  # news text written by people (Lee et al. 2005)
READY_TIMEOUT_S = 300.0  # the generation service loads the model (and on a fresh cache converts it, ~15 s)
REQUEST_TIMEOUT_S = 600.0
GENERATE_PROMPTS = ("Write a short story about a lighthouse keeper.", "Explain how rain forms.",
                    "Describe a busy market in the morning.", "Give advice to a new gardener.")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def human_texts(tokens: int, count: int) -> list[str]:
    """``count`` windows of the human corpus, each decoded from ``tokens`` consecutive tokens."""
    import importlib.metadata

    vocab = load_vocabulary()
    path = importlib.metadata.distribution("gensim").locate_file(HUMAN_CORPUS)
    ids = encode(vocab, " ".join(Path(path).read_text(encoding="utf-8").split()))
    windows = [ids[i:i + tokens] for i in range(0, len(ids) - tokens, tokens)]
    return [vocab.tokenizer.decode(windows[i % len(windows)]) for i in range(count)]


def post(url: str, body: dict, token: str) -> tuple[int, float, dict | None]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            payload, status = json.loads(response.read()), response.status
    except urllib.error.HTTPError as error:
        payload, status = None, error.code
        error.read()
    return status, time.perf_counter() - start, payload


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list."""
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def load_phase(url: str, bodies: list[dict], token: str, concurrency: int) -> dict:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda body: post(url, body, token), bodies))
    wall = time.perf_counter() - start
    latencies = sorted(seconds for status, seconds, _ in results if status == 200)
    errors = [status for status, _, _ in results if status != 200]
    summary = {"requests": len(bodies), "concurrency": concurrency, "ok": len(latencies), "errors": len(errors),
               "error_statuses": sorted(set(errors)), "wall_s": round(wall, 3),
               "requests_per_s": round(len(latencies) / wall, 3)}
    if latencies:
        summary.update(p50_ms=round(percentile(latencies, 50) * 1e3, 1), p99_ms=round(percentile(latencies, 99) * 1e3, 1),
                       max_ms=round(latencies[-1] * 1e3, 1))
    return summary, [payload for status, _, payload in results if status == 200]


def wait_ready(url: str, process: subprocess.Popen, name: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the {name} service exited with status {process.returncode}")
        with contextlib.suppress(urllib.error.URLError, OSError), \
                urllib.request.urlopen(url + "/healthz", timeout=2.0) as response:
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the {name} service did not answer /healthz within {READY_TIMEOUT_S:.0f} s")


def stop(children) -> None:
    """SIGTERM to every service still running, then wait for each (killed after 60 s)."""
    children = list(children)
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            child.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detect-requests", type=int, default=400)
    parser.add_argument("--generate-requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16, help="client threads per phase")
    parser.add_argument("--detect-tokens", type=int, default=300)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--detector-workers", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=16, help="the generation engine's batch size")
    parser.add_argument("--out", help="output JSON path (default benchmarks/results/service_load.json)")
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="provmark-load-"))
    env = {**os.environ, "PROVMARK_HOME": str(home), "PROVMARK_MODELS_DIR": str(models_dir()),
           "PROVMARK_RATE_LIMIT": "0", "PROVMARK_MAX_NUM_SEQS": str(args.max_num_seqs),
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PROVMARK_DATABASE_URL", None)  # the benchmark's own SQLite in its temporary home
    ports = {"detector": free_port(), "generation": free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    commands = {"detector": ["--workers", str(args.detector_workers)], "generation": []}
    children = {}
    try:
        for name in ("detector", "generation"):
            children[name] = subprocess.Popen(
                [sys.executable, "-m", "api.cli", "serve", name, "--port", str(ports[name]), *commands[name]],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
            wait_ready(urls[name], children[name], name)  # one at a time: first starts create the database
        token = (home / "admin.token").read_text().strip()

        texts = human_texts(args.detect_tokens, args.detect_requests)
        post(urls["detector"] + "/v1/detect", {"text": texts[0]}, token)  # warm-up (tables, caches)
        detect, verdicts = load_phase(urls["detector"] + "/v1/detect", [{"text": t} for t in texts], token,
                                      args.concurrency)
        detect["detect_tokens"] = args.detect_tokens
        detect["verdicts"] = {v: sum(1 for p in verdicts if p.get("verdict") == v) for v in
                              sorted({p.get("verdict") for p in verdicts})}

        def generate_body(i: int) -> dict:
            return {"prompt": GENERATE_PROMPTS[i % len(GENERATE_PROMPTS)], "max_new_tokens": args.new_tokens,
                    "ignore_eos": True, "seed": i}

        post(urls["generation"] + "/v1/generate", generate_body(0), token)  # warm-up (compiled kernels)
        generate, outputs = load_phase(urls["generation"] + "/v1/generate",
                                       [generate_body(i) for i in range(args.generate_requests)], token,
                                       args.concurrency)
        tokens = sum(p["usage"]["completion_tokens"] for p in outputs)
        generate.update(new_tokens=args.new_tokens, tokens_per_s=round(tokens / generate["wall_s"], 2))
        with urllib.request.urlopen(urls["generation"] + "/healthz", timeout=10) as response:
            generate["engine"] = json.loads(response.read())["engine"]
    finally:
        stop(children.values())

    payload = {"benchmark": "service_load", "machine": machine(),
               "command": "python benchmarks/service_load.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "detector_workers": args.detector_workers, "max_num_seqs": args.max_num_seqs,
               "detect": detect, "generate": generate}
    write_json("service_load", payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
