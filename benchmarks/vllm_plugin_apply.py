"""The vLLM plugin's own work per decoding step, without vLLM: ``WatermarkedBatch.apply`` on [B, V] logits.

    python benchmarks/vllm_plugin_apply.py [--batch 16] [--steps 60] [--threads 2] [--specs "gumbel:h=4;synthid:h=4"]
        [--profile] [--out FILE]

Each spec gets B requests with the sampled settings of vllm_throughput.py (temperature 0.8, top-k 50,
top-p 0.95) and a key bound to it; every step appends one seeded random token per row (as vLLM's
engine appends its sample: fresh contexts, so few positions sit out as repeats) and times ``apply`` on a
fresh copy of the same logits. ``tokens`` is a digest of every chosen token: equal digests before and
after a change mean the same choices. ``--profile`` prints cProfile's top entries per spec.
"""

from __future__ import annotations

import cProfile
import hashlib
import pstats
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, write_json  # noqa: E402
from generation.sample.params import SamplingParams  # noqa: E402
from generation.vllm.rows import RequestWatermarks, WatermarkedBatch, use_native_kernels  # noqa: E402
from watermark.keys import Keyring  # noqa: E402

V = 49152  # SmolLM2's logits width
SAMPLED = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}  # benchmarks/engine_throughput.py's SAMPLED
PROMPT_LEN = 64
WARMUP_STEPS = 3


def bench_key(keyring: Keyring, spec: str) -> str:
    """A key bound to ``spec`` with a fixed secret: token digests compare between processes (before/after)."""
    secret = hashlib.sha256(f"vllm_plugin_apply {spec}".encode()).digest()
    return keyring.create(f"bench-{secrets.token_hex(4)}", secret=secret, spec=spec).key_id


def run_spec(spec: str, key_id: str, batch: int, steps: int, keyring: Keyring) -> tuple[list[float], str]:
    """(per-step apply times in ms, digest of the chosen tokens) for ``batch`` rows under ``spec``."""
    extra = {"provmark_watermark": spec, "provmark_key_id": key_id}
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, V, (batch, PROMPT_LEN), generator=gen).tolist()
    outputs: list[list[int]] = [[] for _ in range(batch)]
    rows = WatermarkedBatch(RequestWatermarks(V, keyring))
    rows.update([], [(i, extra, prompts[i], outputs[i], SamplingParams(**SAMPLED, seed=i)) for i in range(batch)], [])
    logits = torch.randn(batch, V, generator=gen) * 3
    digest = hashlib.sha256()
    samples = []
    for step in range(steps + WARMUP_STEPS):
        for out in outputs:  # vLLM appends its sample; a random token keeps contexts fresh
            out.append(int(torch.randint(100, V, (), generator=gen)))
        work = logits.clone()
        start = time.perf_counter()
        rows.apply(work)
        elapsed = (time.perf_counter() - start) * 1e3
        digest.update(work.argmax(-1).numpy().tobytes())
        if step >= WARMUP_STEPS:
            samples.append(elapsed)
    return samples, digest.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (vLLM's CPU worker uses the cores)")
    parser.add_argument("--specs", default="gumbel:h=4;synthid:h=4", help="specs separated by ';'")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    native = use_native_kernels()  # as the plugin does in vLLM's worker
    keyring = Keyring(Path(tempfile.mkdtemp(prefix="provmark-plugin-bench-")), master_key=secrets.token_bytes(32))
    keyring.create("bench")
    results = {}
    for spec in [s for s in args.specs.split(";") if s]:
        key_id = bench_key(keyring, spec)
        run_spec(spec, key_id, args.batch, 5, keyring)  # warm caches and lazy builds outside the timed run
        samples, tokens = run_spec(spec, key_id, args.batch, args.steps, keyring)
        results[spec] = {"median_ms": round(statistics.median(samples), 3), "min_ms": round(min(samples), 3),
                         "tokens": tokens}
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(run_spec, spec, key_id, args.batch, args.steps, keyring)
            pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    payload = {"benchmark": "vllm_plugin_apply", "batch": args.batch, "vocab": V, "steps": args.steps,
               "settings": SAMPLED, "native_kernels": native, "machine": machine(), "results": results}
    write_json("vllm_plugin_apply", payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
