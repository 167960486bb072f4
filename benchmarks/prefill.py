"""The prefill of engine_throughput.py's prompts: one pass of their own tokens against padded groups.

    python benchmarks/prefill.py [--batch 64] [--rounds 3] [--threads 2] [--dtype float32]

The runner prefills the B prompts of engine_throughput.py (lengths spread over 10..200 tokens) into fresh
blocks, alternately ``flat`` (the engine's path on the C++ kernels: every prompt token one row at its own
position, one pass over exactly the prompts' tokens) and ``padded`` (groups of similar lengths, longest first,
each padded to its longest, as the scheduler forms them for runners without the kernels). Per path: the median
time of a whole prefill (s), the rows its linears computed, and the ceiling ``benchmarks/roofline.py`` puts on
it (every prompt token through every linear at the best matmul rate it measures, when ``--peak-gflops`` is
given). Prints JSON and writes benchmarks/results/prefill.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json  # noqa: E402
from engine_throughput import make_prompts  # noqa: E402

from generation.kv_cache import CacheConfig  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.runner import ModelRunner  # noqa: E402
from generation.scheduler import PREFILL_PADDING_SLACK  # noqa: E402


def padded_groups(lengths: list[int]) -> list[list[int]]:
    """The scheduler's prefill groups (indices): longest first, a group while its padding stays under the slack."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups = [[order[0]]]
    for i in order[1:]:
        group = [lengths[j] for j in groups[-1]] + [lengths[i]]
        if max(group) * len(group) <= (1 + PREFILL_PADDING_SLACK) * sum(group):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--peak-gflops", type=float, help="roofline.py's best matmul rate, for the ceiling")
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/prefill.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(dtype=args.dtype)
    prompts = make_prompts(args.batch, loaded.vocab.vocab_size)
    lengths = [len(p) for p in prompts]
    per_row = -(-(max(lengths) + 1) // 16)
    runner = ModelRunner(loaded.model, CacheConfig(args.batch * per_row, per_row * 16, 16))
    if not runner.flat_prefill:
        parser.error("this runner has no C++ kernels: it only prefills in padded groups")
    tables = [list(range(i * per_row, (i + 1) * per_row)) for i in range(args.batch)]
    groups = padded_groups(lengths)

    def flat() -> None:
        runner.prefill(prompts, [0] * len(prompts), tables)

    def padded() -> None:
        runner.flat_prefill = False
        try:
            for group in groups:
                runner.prefill([prompts[i] for i in group], [0] * len(group), [tables[i] for i in group])
        finally:
            runner.flat_prefill = True

    paths = {"flat": flat, "padded": padded}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        fn()
    for _ in range(args.rounds):
        for name, fn in paths.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    decoder = loaded.model.get_decoder()
    params = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, torch.nn.Linear))
    rows = {"flat": sum(lengths), "padded": sum(max(lengths[i] for i in g) * len(g) for g in groups)}
    report = {"machine": machine(), "batch": args.batch, "dtype": args.dtype, "prompt_tokens": sum(lengths),
              "padded_groups": len(groups), "paths": {}}
    if args.peak_gflops:
        report["ceiling_s"] = round(2.0 * params * sum(lengths) / (args.peak_gflops * 1e9), 3)
    for name, samples in times.items():
        report["paths"][name] = {"s": round(statistics.median(samples), 3), "runs": [round(t, 3) for t in samples],
                                 "linear_rows": rows[name]}
    path = write_json("prefill", report, args.out)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
