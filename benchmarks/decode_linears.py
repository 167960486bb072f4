"""The decode step's linears alone, at 1, 2 and 4 rows: which kernel streams the default model's weights fastest.

    python benchmarks/decode_linears.py [--threads 2] [--rounds 15] [--dtype float32] [--rows 1,2,4]

The default model's 121 linear weights (30 layers' fused q/k/v, o, fused gate/up, down, and the LM head:
538 MB in float32) are run one after another at each row count through every kernel the engine could use,
the kernels alternated within each round (a busy machine slows all alike):

- ``gemv``: ``provmark_gemv`` (one row only: at more rows it would read the weights once per row);
- ``tile``: ``provmark_linear``, the 8-row x 32-output tile;
- ``onednn``: oneDNN's packed kernel (``torch.ops.mkldnn._linear_pointwise``, the engine's prefill path);
- ``mkl``: ``torch.nn.functional.linear`` on the plain weight.

Per kernel and row count: the median time of a pass over all 121 weights (ms), the weight bytes over it
(GB/s) and the median of its per-round ratio to ``tile``. Prints JSON and writes
benchmarks/results/decode_linears.json.
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

from generation.cpu.decode_linear import PackedDecodeLinear  # noqa: E402
from generation.cpu.packed_linear import PACK_BATCH_HINT  # noqa: E402
from generation.models import load_model  # noqa: E402


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The decoder's weights as the engine runs them (q/k/v and gate/up concatenated) and the LM head's."""
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        out += [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), attn.o_proj.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight]
    return [w.detach().contiguous() for w in out] + [model.get_output_embeddings().weight.detach()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", default="1,2,4", help="comma-separated row counts")
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/decode_linears.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    row_counts = [int(r) for r in args.rows.split(",")]
    loaded = load_model(dtype=args.dtype)
    plain = weights(loaded.model)
    native = [PackedDecodeLinear(w, None) for w in plain]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT) for w in plain]
    total = sum(w.numel() * w.element_size() for w in plain)
    inputs = {(rows, k): torch.randn(rows, k).to(plain[0].dtype) for rows in row_counts for k in {w.shape[1] for w in plain}}

    def pass_of(kernel: str, rows: int) -> float:
        for lin in native:
            lin.gemv_rows = 1 if kernel == "gemv" else 0
        start = time.perf_counter()
        with torch.inference_mode():
            for w, lin, packed in zip(plain, native, onednn):
                x = inputs[(rows, w.shape[1])]
                if kernel in ("gemv", "tile"):
                    lin(x)
                elif kernel == "onednn":
                    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                else:
                    torch.nn.functional.linear(x, w)
        return time.perf_counter() - start

    kernels = {rows: (["gemv"] if rows == 1 else []) + ["tile", "onednn", "mkl"] for rows in row_counts}
    times = {(rows, k): [] for rows in row_counts for k in kernels[rows]}
    for rows in row_counts:
        for k in kernels[rows]:
            pass_of(k, rows)  # warm-up
    for _ in range(args.rounds):
        for rows in row_counts:
            for k in kernels[rows]:
                times[(rows, k)].append(pass_of(k, rows))
    results = {}
    for rows in row_counts:
        row = {}
        for k in kernels[rows]:
            med = statistics.median(times[(rows, k)])
            row[k] = {"ms": round(med * 1e3, 2), "gb_s": round(total / med / 1e9, 1),
                      "over_tile": round(statistics.median(a / b for a, b in zip(times[(rows, k)],
                                                                                  times[(rows, "tile")])), 3)}
        results[f"rows_{rows}"] = row
    write_json("decode_linears", {
        "machine": machine(), "dtype": args.dtype, "weight_bytes": total, "rounds": args.rounds,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "load_average": [round(x, 2) for x in os.getloadavg()], "kernels": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
