"""Linear layers with their weights pre-packed for oneDNN, for the engine's own view of the model.

``torch.nn.functional.linear`` on CPU hands the weight to the BLAS library in its plain row-major layout
on every call; for bf16 that means oneDNN re-blocks the weight each time before its AMX kernels can run.
A decode step at batch 16 multiplies a handful of rows by every weight of the model, so that per-call
reorder is most of the matmul cost. Packing once at start-up (``torch.ops.mkldnn._reorder_linear_weight``,
the layout torch's inductor uses for frozen CPU graphs) and calling ``_linear_pointwise`` removes it:
measured on a 2-core Sapphire Rapids CPU, the [16, 576] x [576, 49152] LM head takes 4.4 ms packed vs
14.3 ms plain in bf16 (17 vs 27 ms in fp32); see benchmarks/engine_throughput.py for the end-to-end effect.

``packed_view(model)`` (generation/cpu/packed_view.py) returns a second module tree that shares every parameter with ``model`` (no copy
of the weights) but has its ``nn.Linear`` layers replaced: the caller's model object is never modified, so
the same loaded model can still be used by ``model.generate`` or anything else.
"""

from __future__ import annotations

import torch
from torch import nn

PACK_BATCH_HINT = 16  # the packed layout is chosen for this many rows; any row count works (tested)
# Below this many rows the plain weight is used instead: in fp32 MKL's own kernel wins at batch 1
# (engine_throughput, quiet machine: 14.4 packed vs 15.9 tok/s for transformers' plain path), while
# bf16 gains from packing at every row count.
PLAIN_BELOW_ROWS = {torch.float32: 4}
SELF_CHECK_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 1e-2}


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with ``W`` held in oneDNN's blocked layout (inference only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.weight = weight  # the caller's tensor (no copy), for small row counts
        self.plain_below_rows = PLAIN_BELOW_ROWS.get(weight.dtype, 0)
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT),
                             persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()
        # callable x -> x @ W.T + b used for up to decode_kernel_rows rows (generation/cpu/native_layers.py)
        self.decode_kernel, self.decode_kernel_rows = None, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.decode_kernel is not None and x.numel() <= self.decode_kernel_rows * self.in_features:
            return self.decode_kernel(x)
        if x.numel() < self.plain_below_rows * self.in_features:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def packing_available(model: nn.Module) -> bool:
    """True when the model lives on the CPU, in a dtype oneDNN packs, and this torch build has the ops."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or param.dtype not in SELF_CHECK_TOLERANCE:
        return False
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return _self_check(param.dtype)


def _self_check(dtype: torch.dtype) -> bool:
    """The packed op must agree with F.linear on this machine (some CPUs lack the bf16 kernels)."""
    gen = torch.Generator().manual_seed(0)
    linear = nn.Linear(64, 48, bias=True, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=gen))
        linear.bias.copy_(torch.randn(48, generator=gen))
    x = torch.randn(3, 5, 64, generator=gen).to(dtype)
    try:
        with torch.inference_mode():
            got = PackedLinear(linear)(x).float()
            want = linear(x).float()
    except (RuntimeError, NotImplementedError):
        return False
    scale = want.abs().max().clamp_min(1.0)
    return bool(((got - want).abs().max() / scale) <= SELF_CHECK_TOLERANCE[dtype])
