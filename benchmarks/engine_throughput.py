"""Engine throughput vs transformers ``model.generate`` on the same model, settings and machine.

Workloads: batch 1 and 16 concurrent requests (prompt lengths 10..200), 128 new tokens
forced (min_new_tokens = max_new_tokens), greedy and sampled; plus the engine's slowdown when every
request is watermarked (default spec, a throwaway key; with ``--two-part`` also a two-part key, whose
two halves are both biased). Each figure is the median of ``--runs`` timed
runs after one warm-up; engine and transformers runs alternate so load from other processes hits both.

    python benchmarks/engine_throughput.py [--runs 3] [--dtype float32] [--threads 2] [--batches 1,16,64] [--vllm]
        [--omp-wait-policy default|passive|active] [--two-part] [--no-transformers] [--device cpu|cuda]

``--device cuda`` runs both sides on the GPU (the engine with its CUDA path: block-table attention and CUDA
graphs, generation/gpu/); benchmarks/gpu_check.sh runs it that way.

Writes benchmarks/results/engine_throughput.json and prints the same JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import secrets
import statistics
import sys
import time
from pathlib import Path

from watermark.config import WatermarkSpec
from watermark.public_key import public_half_secret
from watermark.scheme import Watermark

# OpenMP's wait policy must be chosen before torch loads OpenMP. By default the run keeps OpenMP's own
# default (workers spin a while before sleeping), which is what a service gets; short kernels pay a thread
# wake-up each under PASSIVE (2-3x slower 576x576 matmuls here).
# On a loaded machine, --omp-wait-policy passive: two spinning processes stall each other (0.7 vs
# 8 tokens/s measured at batch 1).
WAIT_POLICIES = ("default", "passive", "active")


def _early_wait_policy(argv: list[str]) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith("--omp-wait-policy="):
            return arg.split("=", 1)[1]
        if arg == "--omp-wait-policy" and i + 1 < len(argv):
            return argv[i + 1]
    return "default"


if __name__ == "__main__" and _early_wait_policy(sys.argv[1:]) in ("passive", "active"):
    os.environ["OMP_WAIT_POLICY"] = _early_wait_policy(sys.argv[1:]).upper()

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import write_json

from generation.engine import Engine
from generation.models import load_model
from generation.runner import ComputePaths
from generation.sample.sampler import SamplingParams

RESULT_PATH = ROOT / "benchmarks" / "results" / "engine_throughput.json"
NEW_TOKENS = 128
BATCH = 16
BATCHES = (1, BATCH, 64)  # the sizes --batches may name
PROMPT_LENGTHS = (10, 200)  # 16 prompts of 10..200 tokens
PROMPT_SEED = 1234
SAMPLED = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}  # one common sampling setting, same on both sides
FIRST_PLAIN_TOKEN = 100  # SmolLM2 ids below this are special/control tokens; prompts avoid them


def make_prompts(batch: int, vocab_size: int) -> list[list[int]]:
    """Deterministic prompts with lengths spread evenly over PROMPT_LENGTHS."""
    rng = random.Random(PROMPT_SEED)
    low, high = PROMPT_LENGTHS
    lengths = [low + (high - low) * i // max(batch - 1, 1) for i in range(batch)] if batch > 1 else [32]
    rng.shuffle(lengths)
    return [[rng.randrange(FIRST_PLAIN_TOKEN, vocab_size) for _ in range(n)] for n in lengths]


def engine_params(sampled: bool, seed: int) -> SamplingParams:
    extra = SAMPLED if sampled else {"temperature": 0.0}
    return SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, seed=seed, **extra)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so a timer stops when the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_engine(engine: Engine, prompts, sampled: bool, watermark=None) -> float:
    params = [engine_params(sampled, seed=i) for i in range(len(prompts))]
    synchronize(engine.runner.device)
    start = time.perf_counter()
    outs = engine.generate(prompts, params, [watermark] * len(prompts), use_tqdm=False)
    synchronize(engine.runner.device)
    elapsed = time.perf_counter() - start
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == NEW_TOKENS * len(prompts), produced
    return produced / elapsed


@torch.inference_mode()
def run_transformers(model, prompts, sampled: bool, pad_id: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding, as generate() expects for decoder-only models
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    extra = {"do_sample": True, **SAMPLED} if sampled else {"do_sample": False}
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    torch.manual_seed(0)
    synchronize(device)
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                         pad_token_id=pad_id, **extra)
    synchronize(device)
    elapsed = time.perf_counter() - start
    produced = (out.shape[1] - width) * len(prompts)
    assert produced == NEW_TOKENS * len(prompts), produced
    return produced / elapsed


def default_watermark(vocab_size: int, two_part: bool = False):
    """The lead's default spec with a throwaway random key (the keyring is not touched); ``two_part``: a two-part
    key's watermark (both halves biased, watermark.public_key)."""
    secret = secrets.token_bytes(32)
    return Watermark(WatermarkSpec.default(), secret, vocab_size, key_id="benchmark",
                     public_half=public_half_secret(secret) if two_part else None)


def median_of(fns: dict, runs: int) -> dict[str, dict]:
    """Warm every function once, then time them interleaved ``runs`` times; medians and raw runs."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            samples[name].append(fn())
    return {name: {"tokens_per_s": round(statistics.median(v), 2), "runs": [round(x, 2) for x in v]}
            for name, v in samples.items()}


def add_vllm_column(results: dict[str, dict], args) -> None:
    """vLLM's figures on the same workload (its own venv, its own process, after ours: not interleaved).

    vLLM runs plain and with our watermark plugin; ``vllm`` holds its plain figure and
    ``speedup_vs_vllm`` ours over it."""
    from vllm_throughput import run_in_vllm_venv

    report = run_in_vllm_venv(["--engines", "plain,plugin", "--dtype", args.dtype, "--batches", args.batches,
                               "--runs", str(args.runs)])
    for key, entry in results.items():
        theirs = report["results"].get(key, {})
        plain = theirs.get("plain") or theirs.get("opted_out")
        if plain is None:
            continue
        entry["vllm"] = plain
        entry["vllm_with_provmark_plugin"] = theirs.get("plugin") or theirs.get("watermarked")
        entry["speedup_vs_vllm"] = round(entry["engine"]["tokens_per_s"] / plain["tokens_per_s"], 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--two-part", action="store_true",
                        help="also time a two-part key's watermark at 16 concurrent (both halves biased)")
    parser.add_argument("--no-transformers", action="store_true", help="leave the transformers peer out")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--dtype", default="float32", help="model dtype: float32 or bfloat16")
    parser.add_argument("--batches", default=f"1,{BATCH}", help="comma-separated subset of 1,16,64")
    parser.add_argument("--packed-weights", choices=("auto", "on", "off"), default="auto",
                        help="engine linears through oneDNN-packed weights (generation/cpu/packed_linear.py)")
    parser.add_argument("--native-kernels", choices=("auto", "on", "off"), default="auto",
                        help="engine decode attention, RMSNorm and silu*up on the C++ kernels (generation/cpu/native.py)")
    parser.add_argument("--weights", choices=("float", "int8"), default="float",
                        help="the engine's linears: the dtype's weights, or the opt-in int8 ones (--dtype float32)")
    parser.add_argument("--vllm", action="store_true",
                        help="add a vLLM (CPU) column: benchmarks/vllm_throughput.py in .venv-vllm, same prompts and dtype")
    parser.add_argument("--omp-wait-policy", choices=WAIT_POLICIES, default="default",
                        help="OpenMP workers between kernels: OpenMP's default, passive (sleep: for a loaded "
                             "machine) or active (spin); applied before torch loads")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both sides on that device)")
    parser.add_argument("--output", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    torch.set_num_threads(args.threads)

    loaded = load_model(device=args.device, dtype=args.dtype)
    model, vocab_size = loaded.model, loaded.vocab.vocab_size
    pad_id = loaded.vocab.eos_token_id if loaded.vocab.eos_token_id is not None else 0
    packed = {"auto": None, "on": True, "off": False}[args.packed_weights]
    native = {"auto": None, "on": True, "off": False}[args.native_kernels]
    batches = [int(b) for b in args.batches.split(",")]
    if not set(batches) <= set(BATCHES):
        parser.error("--batches: choose from 1,16,64")
    engine = Engine(loaded, max_num_seqs=max(BATCH, *batches), max_model_len=512,
                    paths=ComputePaths(packed_weights=packed, native_kernels=native,
                                       int8_weights=args.weights == "int8"))
    watermark = default_watermark(vocab_size)
    two_part = default_watermark(vocab_size, two_part=True)

    results: dict[str, dict] = {}
    for batch in batches:
        prompts = make_prompts(batch, vocab_size)
        for mode in ("greedy", "sampled"):
            sampled = mode == "sampled"
            fns = {
                "engine": lambda p=prompts, s=sampled: run_engine(engine, p, s),
                "transformers": lambda p=prompts, s=sampled: run_transformers(model, p, s, pad_id),
            }
            if batch > 1:
                fns["engine_watermarked"] = lambda p=prompts, s=sampled: run_engine(engine, p, s, watermark)
                if args.two_part:
                    fns["engine_two_part"] = lambda p=prompts, s=sampled: run_engine(engine, p, s, two_part)
            if args.no_transformers:
                del fns["transformers"]
            figures = median_of(fns, args.runs)
            entry = {name: fig for name, fig in figures.items()}
            if "transformers" in figures:
                entry["speedup_vs_transformers"] = round(
                    figures["engine"]["tokens_per_s"] / figures["transformers"]["tokens_per_s"], 3)
            for name, label in (("engine_watermarked", "watermark_slowdown"), ("engine_two_part", "two_part_slowdown")):
                if name in figures:
                    entry[label] = round(1 - figures[name]["tokens_per_s"] / figures["engine"]["tokens_per_s"], 4)
            results[f"batch{batch}_{mode}"] = entry
            print(f"batch {batch} {mode}: {json.dumps(entry)}", file=sys.stderr, flush=True)

    if args.vllm:
        add_vllm_column(results, args)

    report = {
        "benchmark": "engine_throughput",
        "command": "python benchmarks/engine_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": loaded.model_id,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "weights": args.weights,
        "threads": args.threads,
        "engine_packed_weights": engine.runner.packed_weights,
        "engine_native_kernels": engine.runner.native_attention,
        "device": str(loaded.device),
        "device_name": torch.cuda.get_device_name(loaded.device) if loaded.device.type == "cuda" else None,
        "engine_block_table_attention": engine.runner.block_table_attention,
        "engine_cuda_graphs": engine.runner.graphs is not None and engine.runner.graphs.capture,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "new_tokens": NEW_TOKENS,
        "batch": BATCH,
        "prompt_lengths": list(PROMPT_LENGTHS),
        "sampled_settings": SAMPLED,
        "watermark_spec": watermark.spec.format(),
        "runs": args.runs,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "torch": torch.__version__},
        "results": results,
        "note": "medians of interleaved runs after a warm-up; other processes on the machine add noise to both sides",
    }
    write_json("engine_throughput", report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
