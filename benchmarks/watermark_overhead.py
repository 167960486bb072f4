"""Time to watermark-bias logits [B, V] against transformers' WatermarkLogitsProcessor.

    python benchmarks/watermark_overhead.py [--batches 1 16 64] [--repeats 20] [--out FILE]

Both sides get the same random logits and token histories in the same process. Ours is timed
after its one-off compile (reported separately as ``compile_warmup_s``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from transformers.generation.logits_process import WatermarkLogitsProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, time_call, write_json  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402

V = 49152  # SmolLM2's logits width
HISTORY = 32


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--hf-selfhash-repeats", type=int, default=3, help="transformers' selfhash is slow")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    key = os.urandom(32)
    ours = {
        "lefthash": Watermark("kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0", key, V),
        "selfhash": Watermark("kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0", key, V),
    }
    warm = time.perf_counter()
    for wm in ours.values():
        for b in args.batches:  # compile once for the dynamic batch dimension
            wm.bias(torch.zeros(b, V), [[1] * HISTORY] * b)
    compile_s = time.perf_counter() - warm
    rows = []
    for batch in args.batches:
        gen = torch.Generator().manual_seed(batch)
        ids = torch.randint(0, V, (batch, HISTORY), generator=gen)
        hist = ids.tolist()
        logits = torch.randn(batch, V, generator=gen)
        for scheme in ("lefthash", "selfhash"):
            wm = ours[scheme]
            # transformers' selfhash at context_width 4 is its closest equivalent of ours
            ref = WatermarkLogitsProcessor(V, "cpu", greenlist_ratio=0.25, bias=2.0, seeding_scheme=scheme,
                                           context_width=1 if scheme == "lefthash" else 4)
            mine = time_call(lambda: wm.bias(logits, hist), args.repeats)
            reps = args.repeats if scheme == "lefthash" else args.hf_selfhash_repeats
            theirs = time_call(lambda: ref(ids, logits.clone()), reps, warmup=1)
            rows.append({
                "batch": batch, "scheme": scheme, "ours_ms": mine["median_ms"],
                "transformers_ms": theirs["median_ms"],
                "ours_ms_per_row": mine["median_ms"] / batch,
                "speedup": theirs["median_ms"] / mine["median_ms"],
            })
            print(f"B={batch:3d} {scheme:9s} ours {mine['median_ms']:.3f} ms  transformers "
                  f"{theirs['median_ms']:.3f} ms  x{rows[-1]['speedup']:.1f}", file=sys.stderr)
    write_json("watermark_overhead", {
        "benchmark": "watermark_overhead", "vocab_size": V, "history": HISTORY,
        "compile_warmup_s": compile_s, "machine": machine(), "results": rows,
    }, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
