"""Linears at decode batch sizes on the native kernels (csrc/engine_kernels.cpp): weights packed once, streamed.

``PackedDecodeLinear`` holds a float32 or bfloat16 weight packed as [n/16][k][16] (each block of 16 outputs
k-major). Up to 16 rows (fp32; 8 bf16: generation/cpu/native_layers.py) the engine's view calls it instead
of oneDNN:

- ``provmark_linear``: tiles of 8 rows x 32 outputs with their accumulators in registers;
- ``provmark_gemv`` for a single row (``gemv_rows``, a batch-1 decode step): eight blocks of 16 outputs in
  flight per thread, so the loop streams the weights instead of waiting on two chains of fused
  multiply-adds. Each output is summed in the tile's order, so both give the same bits
  (tests/test_native.py) and switching between them never changes a token.

Both need AVX-512 (``-march=native`` on a CPU without it builds the other kernels only, and the engine keeps
oneDNN for its linears).
"""

from __future__ import annotations

import torch

from generation.cpu import native

# Rows up to which the 1-row kernel runs: at 2 rows the tile reads the weights once for both rows while the
# 1-row kernel would read them twice (benchmarks/batch1_step.py measures one row).
GEMV_ROWS = {torch.float32: 1, torch.bfloat16: 1}


def decode_linear_available() -> bool:
    """True when this build has the packed decode linear (it needs AVX-512)."""
    if native._library() is None:
        return False
    try:
        return PackedDecodeLinear(torch.zeros(16, 8), None)(torch.zeros(1, 8)).shape == (1, 16)
    except RuntimeError:
        return False


class PackedDecodeLinear:
    """A float32 or bfloat16 linear's weight packed for ``provmark_linear`` / ``provmark_gemv``;
    ``__call__(x)`` computes ``x @ W.T + b`` for x [..., k] of the weight's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        if weight.dtype not in native.DTYPE_CODES or weight.dim() != 2 or not weight.is_cpu:
            raise ValueError(f"PackedDecodeLinear takes a 2-D CPU float32/bfloat16 weight, got {weight.dtype} "
                             f"{tuple(weight.shape)}")
        self.dtype, self.code = weight.dtype, native.DTYPE_CODES[weight.dtype]
        self.out_features, self.in_features = weight.shape
        if self.out_features % 16:
            raise ValueError(f"PackedDecodeLinear: {self.out_features} outputs is not a multiple of 16")
        weight = weight.detach().contiguous()
        self.packed = torch.empty(weight.numel(), dtype=weight.dtype)
        lib = native._checked_library()
        if lib.provmark_pack_linear(self.code, weight.data_ptr(), self.in_features, self.packed.data_ptr(),
                                    self.out_features, self.in_features) != 0:
            raise ValueError("PackedDecodeLinear: the kernel rejected the weight's shape")
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        self.gemv_rows = GEMV_ROWS.get(self.dtype, 0)  # rows up to which provmark_gemv runs (0: never)
        self._linear, self._gemv = lib.provmark_linear, lib.provmark_gemv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = self.in_features
        if x.dtype is not self.dtype or not x.is_cpu or x.shape[-1] != k:
            raise ValueError(f"PackedDecodeLinear: input {x.dtype} {tuple(x.shape)} does not fit {k} {self.dtype} "
                             "inputs")
        if not x.is_contiguous():
            x = x.contiguous()
        out = torch.empty((*x.shape[:-1], self.out_features), dtype=self.dtype)
        rows = x.numel() // k
        if rows == 0:
            return out
        bias = None if self.bias is None else self.bias.data_ptr()
        if rows <= self.gemv_rows:
            rc = self._gemv(self.code, x.data_ptr(), self.packed.data_ptr(), bias, out.data_ptr(), self.out_features,
                            k, torch.get_num_threads())
        else:
            rc = self._linear(self.code, x.data_ptr(), self.packed.data_ptr(), bias, out.data_ptr(), rows,
                              self.out_features, k, torch.get_num_threads())
        if rc != 0:
            raise RuntimeError("PackedDecodeLinear: this build of the kernels has no AVX-512 linear")
        return out
