"""The decode step's linears alone, at 1, 2 and 4 rows: which kernel streams the default model's weights fastest.

    python benchmarks/decode_linears.py [--threads 2] [--rounds 15] [--dtype float32] [--rows 1,2,4] [--against REV]

The default model's 121 linear weights (30 layers' fused q/k/v, o, fused gate/up, down, and the LM head:
538 MB in float32) are run one after another at each row count through every kernel the engine could use,
the kernels alternated within each round (a busy machine slows all alike):

- ``gemv``: ``provmark_gemv`` (one row only: at more rows it would read the weights once per row);
- ``tile``: ``provmark_linear``, the 8-row x 32-output tile;
- ``onednn``: oneDNN's packed kernel (``torch.ops.mkldnn._linear_pointwise``, the engine's prefill path);
- ``mkl``: ``torch.nn.functional.linear`` on the plain weight;
- with ``--against REV``: ``gemv@REV`` and ``tile@REV``, the same two kernels built from
  generation/cpu/csrc/engine_kernels.cpp as it was at git revision REV (the same packed weights; their outputs
  must equal today's bit for bit), to measure a change to the kernels in one process. Timed second in each
  round, identical code comes out about 1 % faster (0.99 against ``tile``), which bounds what a ratio shows.

Per kernel and row count: the median time of a pass over all 121 weights (ms), the weight bytes over it
(GB/s) and the median of its per-round ratio to ``tile``. Prints JSON and writes
benchmarks/results/decode_linears.json.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json  # noqa: E402

from generation.cpu import native  # noqa: E402
from generation.cpu.decode_linear import PackedDecodeLinear  # noqa: E402
from generation.cpu.packed_linear import PACK_BATCH_HINT  # noqa: E402
from generation.models import load_model  # noqa: E402
from watermark.native_build import build_cached  # noqa: E402

SOURCE = "generation/cpu/csrc/engine_kernels.cpp"


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The decoder's weights as the engine runs them (q/k/v and gate/up concatenated) and the LM head's."""
    out = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        out += [torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]), attn.o_proj.weight,
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight]
    return [w.detach().contiguous() for w in out] + [model.get_output_embeddings().weight.detach()]


def kernels_at(rev: str) -> dict:
    """``provmark_linear`` and ``provmark_gemv`` built from the kernels' source at git revision ``rev``."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{SOURCE}"], capture_output=True, text=True,
                           check=False)
    if shown.returncode != 0:
        raise SystemExit(f"--against {rev}: {shown.stderr.strip()}")
    ours = native._checked_library()
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "engine_kernels.cpp"
        source.write_text(shown.stdout)
        try:
            lib = ctypes.CDLL(str(build_cached(native._compiler() or "g++", source, native.FLAGS, "engine_kernels_at",
                                               salt=native._cpu_flags())))
        except (OSError, RuntimeError) as exc:
            raise SystemExit(f"--against {rev}: its kernels do not build here: {exc}") from exc
    functions = {}
    for name in ("provmark_linear", "provmark_gemv"):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = getattr(ours, name).argtypes, getattr(ours, name).restype
        functions[name] = fn
    return functions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rows", default="1,2,4", help="comma-separated row counts")
    parser.add_argument("--against", metavar="REV", help="also time the 1-row kernel and the tile as built at REV")
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/decode_linears.json)")
    args = parser.parse_args(argv)
    other = kernels_at(args.against) if args.against else None
    torch.set_num_threads(args.threads)
    row_counts = [int(r) for r in args.rows.split(",")]
    loaded = load_model(dtype=args.dtype)
    plain = weights(loaded.model)
    packed_native = [PackedDecodeLinear(w, None) for w in plain]
    ours = native._checked_library()
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT) for w in plain]
    total = sum(w.numel() * w.element_size() for w in plain)
    inputs = {(rows, k): torch.randn(rows, k).to(plain[0].dtype) for rows in row_counts for k in {w.shape[1] for w in plain}}

    def use(kernel: str) -> str:
        name, _, rev = kernel.partition("@")
        for lin in packed_native:
            lin.gemv_rows = 1 if name == "gemv" else 0
            lin._linear = other["provmark_linear"] if rev else ours.provmark_linear
            lin._gemv = other["provmark_gemv"] if rev else ours.provmark_gemv
        return name

    def pass_of(kernel: str, rows: int) -> float:
        name = use(kernel)
        start = time.perf_counter()
        with torch.inference_mode():
            for w, lin, packed in zip(plain, packed_native, onednn):
                x = inputs[(rows, w.shape[1])]
                if name in ("gemv", "tile"):
                    lin(x)
                elif kernel == "onednn":
                    torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
                else:
                    torch.nn.functional.linear(x, w)
        return time.perf_counter() - start

    at = [f"@{args.against}"] if other else []
    kernels = {rows: [f"{name}{rev}" for name in (["gemv"] if rows == 1 else []) + ["tile"] for rev in ["", *at]]
               + ["onednn", "mkl"] for rows in row_counts}
    for rows in row_counts:  # a kernel from another revision must compute the same bits to be compared
        for kernel in kernels[rows]:
            if "@" in kernel:
                x = inputs[(rows, plain[-1].shape[1])]
                use(kernel.partition("@")[0])
                expected = packed_native[-1](x)
                use(kernel)
                if not torch.equal(packed_native[-1](x), expected):
                    raise SystemExit(f"{kernel} does not compute today's bits at {rows} rows")
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
        "against": args.against,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "load_average": [round(x, 2) for x in os.getloadavg()], "kernels": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
