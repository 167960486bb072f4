"""Where a batch-1 decode step's time goes: one greedy request alone, float32, its steps timed piece by piece.

    python benchmarks/batch1_step.py [--threads 2] [--rounds 120] [--steps 1] [--dtype float32]

One request (a 32-token prompt, greedy, forced to run) decodes alone in the engine. Each round times
``--steps`` steps on each of three paths in turn, in the same process (so a busy machine slows all alike):
``before``, the decode-batch kernel's 8-row x 32-output tile at one row and transformers' module forward;
``gemv``, the 1-row kernel (``provmark_gemv``: each weight read once, eight 16-output blocks in flight);
``after``, that kernel and the direct step (generation/cpu/direct_decode.py: the same kernels in a plain
loop over the layers); ``stack``, the direct step's layers in one native call (generation/cpu/decode_stack.py:
the wrappers below see only the LM head inside it, so its linears, attention and norms count in
``forward_rest_ms``). ``--weights int8`` runs the int8 weights on every path (``before`` and ``gemv`` then
differ only in the direct step being off). Per step (medians over the rounds, of each round's mean):

- ``step_ms``: ``Engine.step`` (schedule, forward, sampling, bookkeeping);
- ``linears_ms``: the 30 layers' q/k/v, o, gate/up and down matmuls; ``lm_head_ms``: the LM head;
- ``attention_ms``: the attention kernel (rotary, cache write, attention); ``norm_mlp_ms``: RMSNorm and silu*up;
- ``forward_rest_ms``: the rest of ``ModelRunner.decode`` (module calls, residual adds, rotary table, Python);
- ``sampling_ms``: ``Engine._postprocess`` (logits pipeline, stop checks, detokenizing);
- ``other_ms``: the rest of the step (scheduling, block tables, the request's output).

The timing wrappers add a few microseconds per call (about 200 calls a step). Also reported: the weight
bytes a step streams and the bandwidth the linears reach (bytes / (linears + LM head)), and each path's
step time over ``before``'s, the median of the per-round ratios. Prints JSON and writes benchmarks/results/batch1_step.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json  # noqa: E402

from generation.cpu import decode_linear, native, paged_native  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.runner import ComputePaths  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402

PARTS = ("linears", "lm_head", "attention", "norm_mlp", "forward", "sampling", "step")


class Clock:
    """Accumulated wall time per part."""

    def __init__(self) -> None:
        self.total = dict.fromkeys(PARTS, 0.0)

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total[part] += time.perf_counter() - start
        return timed


def kernel_owners(engine: Engine) -> tuple[list, object]:
    """The decoder's linears (packed linears and fused groups holding a decode kernel) and the LM head."""
    view = engine.runner.decoder
    head = engine.runner.lm_head
    owners, seen = [], set()
    for module in view.modules():
        owner = getattr(module, "group", module)
        if getattr(owner, "decode_kernel", None) is not None and id(owner) not in seen:
            seen.add(id(owner))
            owners.append(owner)
    return owners, head


def instrument(engine: Engine, clock: Clock) -> None:
    owners, head = kernel_owners(engine)
    for owner in owners:
        owner.decode_kernel = clock.wrap("linears", owner.decode_kernel)
    if getattr(head, "decode_kernel", None) is not None:
        head.decode_kernel = clock.wrap("lm_head", head.decode_kernel)
    paged_native.rope_cache_attention = clock.wrap("attention", paged_native.rope_cache_attention)
    native.rms_norm = clock.wrap("norm_mlp", native.rms_norm)
    native.silu_mul = clock.wrap("norm_mlp", native.silu_mul)
    engine.runner.decode = clock.wrap("forward", engine.runner.decode)
    engine._postprocess = clock.wrap("sampling", engine._postprocess)
    engine.step = clock.wrap("step", engine.step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1, help="steps timed per path per round")
    parser.add_argument("--rounds", type=int, default=120, help="rounds over the three paths (medians reported)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--weights", choices=("float", "int8"), default="float")
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/batch1_step.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(dtype=args.dtype)
    engine = Engine(loaded, max_num_seqs=4, max_model_len=2048,
                    paths=ComputePaths(int8_weights=args.weights == "int8"))
    owners, head = kernel_owners(engine)
    kernels = [o.decode_kernel for o in owners] + [head.decode_kernel]
    clock = Clock()
    instrument(engine, clock)
    new = 2 * args.rounds * args.steps + 16
    prompt = list(range(1000, 1032))
    engine.submit(prompt, SamplingParams(max_new_tokens=new, min_new_tokens=new, temperature=0.0))
    for _ in range(8):  # prefill and warm-up
        engine.step()
    direct = engine.runner.direct
    stack = None if direct is None else direct.stack
    per_path: dict[str, list[dict]] = {"before": [], "gemv": [], "after": [], "stack": []}
    for _ in range(args.rounds):
        for path in per_path:
            set_path_on(kernels, path)
            engine.runner.direct = direct if path in ("after", "stack") else None
            if direct is not None:
                direct.stack = stack if path == "stack" else None
            before = dict(clock.total)
            for _ in range(args.steps):
                engine.step()
            per_path[path].append({k: (clock.total[k] - before[k]) * 1e3 / args.steps for k in PARTS})
    weight_bytes = sum(k.packed.numel() * k.packed.element_size() for k in kernels)
    results = {}
    for path, rounds in per_path.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in PARTS}
        kernels_ms = med["linears"] + med["lm_head"] + med["attention"] + med["norm_mlp"]
        results[path] = {
            "step_ms": round(med["step"], 3),
            "linears_ms": round(med["linears"], 3),
            "lm_head_ms": round(med["lm_head"], 3),
            "attention_ms": round(med["attention"], 3),
            "norm_mlp_ms": round(med["norm_mlp"], 3),
            "forward_rest_ms": round(med["forward"] - kernels_ms, 3),
            "sampling_ms": round(med["sampling"], 3),
            "other_ms": round(med["step"] - med["forward"] - med["sampling"], 3),
            # the stack path's linears run inside one native call, out of the wrappers' sight
            "weights_gb_s": (round(weight_bytes / ((med["linears"] + med["lm_head"]) / 1e3) / 1e9, 1)
                             if med["linears"] > 0 else None),
            "tokens_s": round(1e3 / med["step"], 1),
        }
    out = {
        "machine": machine(),
        "dtype": args.dtype,
        "weights": args.weights,
        "weight_bytes_per_step": weight_bytes,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "paths": results,
        "step_over_before": {path: round(statistics.median(r["step"] / b["step"] for r, b in
                                                          zip(rounds, per_path["before"])), 3)
                             for path, rounds in per_path.items()},
        "direct_step": direct is not None,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    write_json("batch1_step", out, args.out)
    return 0


def set_path_on(kernels: list, path: str) -> None:
    for kernel in kernels:
        if isinstance(kernel, (decode_linear.PackedDecodeLinear, decode_linear.Int8DecodeLinear)):
            kernel.gemv_rows = 0 if path == "before" else decode_linear.GEMV_ROWS.get(kernel.dtype, 0)


if __name__ == "__main__":
    raise SystemExit(main())
