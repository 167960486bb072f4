"""A decode step's attention alone: the paged rotary + cache write + attention kernel over 30 layers' pools.

    python benchmarks/decode_attention.py [--threads 2] [--rounds 10] [--shapes 64x169,64x400,16x169,16x1000,1x1000]
                                          [--pools 30]

Each shape ``BxN`` is B rows, each attending to N + 1 keys, with the default model's attention (9 query heads,
3 key/value heads of 64) in float32. Every layer has its own key and value pools (blocks of 16 positions,
handed out in a shuffled order, as a long-running engine's are), so a step reads B x (N + 1) keys and values
per layer from memory, as the engine's decode step does: 501 MB for 64 rows at 169 keys. Per shape: the
median time of a step over the 30 layers (ms) and the cache bytes it reads over that time (GB/s). With
``--pools N`` the 30 layers take turns over N pools: ``--pools 1`` keeps the one pool in cache (16.7 MB at 64 x 169),
which leaves the kernel's arithmetic. Prints JSON and writes benchmarks/results/decode_attention.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, wall_times_ms, write_json  # noqa: E402

from generation.cpu import paged_native  # noqa: E402

LAYERS, HEADS, KV_HEADS, DIM, BLOCK = 30, 9, 3, 64, 16
DEFAULT_SHAPES = "64x169,64x400,16x169,16x1000,1x1000"


def step_of(rows: int, keys: int, seed: int = 0, pools_count: int = LAYERS):
    """A closure running one decode step's attention for ``rows`` rows at position ``keys``, and the bytes it reads."""
    gen = torch.Generator().manual_seed(seed)
    per_row = -(-(keys + 1) // BLOCK)
    blocks = rows * per_row
    pools = [(torch.randn(blocks, KV_HEADS, BLOCK, DIM, generator=gen), torch.randn(blocks, KV_HEADS, BLOCK, DIM, generator=gen))
             for _ in range(pools_count)]
    order = list(range(blocks))
    random.Random(seed).shuffle(order)
    tables = torch.tensor([order[i * per_row:(i + 1) * per_row] for i in range(rows)], dtype=torch.int64)
    positions = torch.full((rows,), keys, dtype=torch.int64)
    qkv = torch.randn(rows, 1, (HEADS + 2 * KV_HEADS) * DIM, generator=gen)
    cos, sin = torch.randn(rows, 1, DIM, generator=gen), torch.randn(rows, 1, DIM, generator=gen)

    def step() -> None:
        for layer in range(LAYERS):
            k, v = pools[layer % len(pools)]
            paged_native.rope_cache_attention(qkv, cos, sin, k, v, tables, positions, HEADS, DIM ** -0.5)

    return step, LAYERS * rows * (keys + 1) * KV_HEADS * DIM * 4 * 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated ROWSxKEYS")
    parser.add_argument("--pools", type=int, default=LAYERS, help="distinct pools the 30 layers take turns over")
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/decode_attention.json)")
    args = parser.parse_args(argv)
    if args.pools < 1:
        parser.error("--pools: at least 1")
    torch.set_num_threads(args.threads)
    report = {"machine": machine(), "rounds": args.rounds, "pools": args.pools, "shapes": {}}
    for shape in args.shapes.split(","):
        rows, keys = (int(x) for x in shape.split("x"))
        step, nbytes = step_of(rows, keys, pools_count=args.pools)
        ms = statistics.median(wall_times_ms(step, args.rounds, warmup=3))
        report["shapes"][shape] = {"ms": round(ms, 2), "mb_read": round(nbytes / 1e6, 1),
                                   "gb_s": round(nbytes / ms / 1e6, 1)}
        del step
    path = write_json("decode_attention", report, args.out)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
