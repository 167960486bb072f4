"""The ceiling of engine_throughput.py's workloads on this machine: what any engine could reach.

Measures, in one process with the benchmark's threads: the memory bandwidth (a sum over a 512 MB tensor) and
the matmul rate of oneDNN's packed kernels on the model's own layer shapes (the fastest matmul this torch
build has on the CPU: ``torch.ops.mkldnn._linear_pointwise``, the engine's prefill and bf16 decode path), in
float32 and bfloat16, at prefill row counts (512) and at the decode batch (16, 64). From the model's linear
weights it then bounds engine_throughput.py's workloads (1 request with a 32-token prompt; 16 and 64 with prompts
of 10..200 tokens; 128 new tokens each):

- prefill: every prompt token through every linear but the LM head (once per prompt), at the best matmul
  rate measured;
- each decode step: the larger of its matmul work at that rate and its memory traffic at the measured
  bandwidth (every weight once, and every row's cached keys and values).

Attention, norms, sampling and Python are left out, so the bound is generous: no engine on this machine runs
the workload faster. With ``--measured FILE`` (engine_throughput.py's JSON) each greedy figure, ours and
vLLM's, is set against it.

    python benchmarks/roofline.py [--threads 2] [--measured benchmarks/results/engine_throughput.json]

Writes benchmarks/results/roofline.json and prints the same JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json
from engine_throughput import BATCHES, NEW_TOKENS, make_prompts

from generation.kv_cache import kv_bytes_per_token
from generation.models import load_model

PREFILL_ROWS = 512
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _seconds(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bandwidth_gb_s() -> float:
    data = torch.ones(128 * 1024 * 1024)  # 512 MB of float32, far past every cache
    return data.numel() * 4 / _seconds(lambda: data.sum()) / 1e9


def matmul_gflops(shapes: list[tuple[int, int]], rows: int, dtype: torch.dtype) -> float:
    """oneDNN's packed matmul over the model's linear shapes [out, in], ``rows`` rows: total GFLOP/s."""
    flops, seconds = 0.0, 0.0
    for out_features, in_features in shapes:
        x = torch.randn(rows, in_features).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(out_features, in_features).to(dtype), rows)
        seconds += _seconds(lambda x=x, w=packed: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
        flops += 2.0 * rows * out_features * in_features
    return flops / seconds / 1e9


def linear_shapes(model: torch.nn.Module) -> tuple[list[tuple[int, int]], tuple[int, int]]:
    """The decoder's distinct linear shapes (with multiplicity) and the LM head's."""
    head = model.get_output_embeddings()
    shapes = [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head]
    return shapes, tuple(head.weight.shape)


def bound(shapes, head, prompts, batch: int, rates: dict, bytes_per_weight: int, kv_per_token: int) -> dict:
    """The workload's least time: prefill at the peak matmul rate; each decode step the larger of its matmul work
    at the peak rate and its memory traffic (every weight once, every row's cached keys and values) at the
    measured bandwidth. Attention's arithmetic, norms, sampling and Python are left out."""
    decoder_params = sum(o * i for o, i in shapes)
    head_params = head[0] * head[1]
    prompt_tokens = sum(len(p) for p in prompts)
    peak = rates["peak_gflops"] * 1e9
    prefill_s = 2.0 * decoder_params * prompt_tokens / peak
    step_flops = 2.0 * (decoder_params + head_params) * batch
    weight_bytes = (decoder_params + head_params) * bytes_per_weight
    # row b at step t attends to len(prompt_b) + t keys: their mean over the steps
    kv_bytes = kv_per_token * (prompt_tokens + batch * (NEW_TOKENS - 1) / 2)
    compute_s, memory_s = step_flops / peak, (weight_bytes + kv_bytes) / (rates["bandwidth_gb_s"] * 1e9)
    step_s = max(compute_s, memory_s)
    total = prefill_s + NEW_TOKENS * step_s
    return {"prompt_tokens": prompt_tokens, "prefill_s": round(prefill_s, 3), "decode_step_ms": round(step_s * 1e3, 2),
            "decode_bound_by": "memory" if memory_s > compute_s else "compute",
            "kv_mb_per_step": round(kv_bytes / 1e6, 1), "ceiling_tokens_per_s": round(NEW_TOKENS * batch / total, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measured", type=Path, help="engine_throughput.py's JSON to set against the ceiling")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(dtype="float32")
    shapes, head = linear_shapes(loaded.model)
    distinct = sorted(set(shapes))
    bandwidth = bandwidth_gb_s()
    report = {"machine": machine(), "bandwidth_gb_s": round(bandwidth, 1), "dtypes": {}}
    measured = json.loads(args.measured.read_text()) if args.measured else None
    for name, dtype in DTYPES.items():
        rates = {"bandwidth_gb_s": bandwidth,
                 "prefill_gflops": matmul_gflops(distinct, PREFILL_ROWS, dtype),
                 "decode16_gflops": matmul_gflops(distinct + [head], 16, dtype),
                 "decode64_gflops": matmul_gflops(distinct + [head], 64, dtype)}
        rates["peak_gflops"] = max(value for key, value in rates.items() if key.endswith("_gflops"))
        entry = {key: round(value, 1) for key, value in rates.items()}
        kv_per_token = kv_bytes_per_token(loaded.model.config, dtype)
        for batch in BATCHES:
            prompts = make_prompts(batch, loaded.vocab.vocab_size)
            entry[f"batch{batch}_greedy"] = bound(shapes, head, prompts, batch, rates, torch.finfo(dtype).bits // 8,
                                                 kv_per_token)
        report["dtypes"][name] = entry
    if measured is not None:
        name = measured.get("dtype", "float32")
        for key, figures in measured.get("results", {}).items():
            ceiling = report["dtypes"].get(name, {}).get(key)
            if ceiling is None:
                continue
            for who in ("engine", "vllm", "transformers"):
                if isinstance(figures.get(who), dict):
                    ceiling[f"{who}_share_of_ceiling"] = round(figures[who]["tokens_per_s"] / ceiling["ceiling_tokens_per_s"], 3)
    write_json("roofline", report, args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
