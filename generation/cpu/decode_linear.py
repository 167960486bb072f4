"""Linears at decode batch sizes on the native kernels (csrc/engine_kernels.cpp): weights packed once, streamed.

``PackedDecodeLinear`` holds a float32 weight packed as [n/16][k][16] (each block of 16 outputs k-major), or a
bfloat16 one as [n/16][k/2][16][2] (pairs of inputs side by side, for AVX512-BF16 dot products; an odd k's last
pair padded with a zero). Up to ``DECODE_KERNEL_ROWS`` rows (generation/cpu/native_layers.py) the engine's view
calls it instead of oneDNN:

- ``provmark_linear``: tiles of 8 rows x 32 outputs with their accumulators in registers;
- ``provmark_gemv`` for a single row (``gemv_rows``, a batch-1 decode step): eight blocks of 16 outputs in
  flight per thread, so the loop streams the weights instead of waiting on two chains of fused
  multiply-adds. Each output is summed in the tile's order, so both give the same bits
  (tests/test_native.py) and switching between them never changes a token.

Both need AVX-512 (``-march=native`` on a CPU without it builds the other kernels only, and the engine keeps
oneDNN for its linears).

``Int8DecodeLinear`` is the opt-in int8 path (``Engine(weights="int8")``): a float32 weight rounded once to
int8 with one float32 scale per output (symmetric, the row's largest magnitude maps to 127), packed the
same way, a quarter of the bytes to stream. ``provmark_linear_q8`` widens each int8 weight to fp32 in
registers and sums as the float32 kernels do, then scales each output once; activations stay float32.
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
        # bfloat16 is packed in pairs of inputs, an odd count's last pair padded with a zero (provmark_pack_linear)
        padded = self.in_features + (self.in_features % 2 if weight.dtype == torch.bfloat16 else 0)
        self.packed = torch.empty(self.out_features * padded, dtype=weight.dtype)
        lib = native._checked_library()
        if lib.provmark_pack_linear(self.code, weight.data_ptr(), self.in_features, self.packed.data_ptr(),
                                    self.out_features, self.in_features) != 0:
            raise ValueError("PackedDecodeLinear: the kernel rejected the weight's shape")
        self.bias = None if bias is None else bias.detach().to(weight.dtype).contiguous()
        self.gemv_rows = GEMV_ROWS.get(self.dtype, 0)  # rows up to which provmark_gemv runs (0: never)
        self._linear, self._gemv = lib.provmark_linear, lib.provmark_gemv

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        def launch(x_ptr: int, out_ptr: int, rows: int, bias: int | None, threads: int) -> int:
            if rows <= self.gemv_rows:
                return self._gemv(self.code, x_ptr, self.packed.data_ptr(), bias, out_ptr, self.out_features,
                                  self.in_features, threads)
            return self._linear(self.code, x_ptr, self.packed.data_ptr(), bias, out_ptr, rows, self.out_features,
                                self.in_features, threads)

        return _apply(self, x, launch)

    def ref(self) -> tuple[int, int | None, int | None, int, int, int]:
        """(packed, scales, bias, n, k, gemv_rows) for provmark_decode_stack (generation/cpu/decode_stack.py)."""
        return (self.packed.data_ptr(), None, None if self.bias is None else self.bias.data_ptr(), self.out_features,
                self.in_features, self.gemv_rows)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [n, k], float32 scale [n]): row j is ``round(W[j] / scale[j])`` with ``scale[j] = max|W[j]| / 127``
    (a row of zeros keeps scale 1)."""
    weight = weight.detach().float()
    peak = weight.abs().amax(dim=1)
    scale = torch.where(peak > 0, peak / 127, torch.ones_like(peak))
    return torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale.contiguous()


class Int8DecodeLinear:
    """A float32 linear held as int8 weights and a float32 scale per output (``quantize_int8``), packed for
    ``provmark_linear_q8``; ``__call__(x)`` computes ``x @ (scale * Q).T + b`` for float32 x [..., k], any
    row count (the engine runs every row of a prefill and a decode through it, so the model is one model)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        if weight.dtype is not torch.float32 or weight.dim() != 2 or not weight.is_cpu:
            raise ValueError(f"Int8DecodeLinear takes a 2-D CPU float32 weight, got {weight.dtype} {tuple(weight.shape)}")
        self.dtype = torch.float32
        self.out_features, self.in_features = weight.shape
        if self.out_features % 16:
            raise ValueError(f"Int8DecodeLinear: {self.out_features} outputs is not a multiple of 16")
        quantized, self.scales = quantize_int8(weight)
        self.packed = torch.empty(quantized.numel(), dtype=torch.int8)
        lib = native._checked_library()
        if lib.provmark_pack_linear(2, quantized.data_ptr(), self.in_features, self.packed.data_ptr(),
                                    self.out_features, self.in_features) != 0:
            raise ValueError("Int8DecodeLinear: the kernel rejected the weight's shape")
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.gemv_rows = 1
        self._linear = lib.provmark_linear_q8

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        def launch(x_ptr: int, out_ptr: int, rows: int, bias: int | None, threads: int) -> int:
            return self._linear(x_ptr, self.packed.data_ptr(), self.scales.data_ptr(), bias, out_ptr, rows,
                                self.out_features, self.in_features, threads)

        return _apply(self, x, launch)

    def ref(self) -> tuple[int, int | None, int | None, int, int, int]:
        """As ``PackedDecodeLinear.ref``, with the scales."""
        return (self.packed.data_ptr(), self.scales.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
                self.out_features, self.in_features, self.gemv_rows)


def _apply(linear, x: torch.Tensor, launch) -> torch.Tensor:
    """``x @ W.T + b`` for x [..., k] of the linear's dtype through ``launch(x, out, rows, bias, threads)`` (a
    kernel call returning its status), with the checks and the output both decode linears share."""
    name, k = type(linear).__name__, linear.in_features
    if x.dtype is not linear.dtype or not x.is_cpu or x.shape[-1] != k:
        raise ValueError(f"{name}: input {x.dtype} {tuple(x.shape)} does not fit {k} {linear.dtype} inputs")
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty((*x.shape[:-1], linear.out_features), dtype=linear.dtype)
    rows = x.numel() // k
    if rows == 0:
        return out
    bias = None if linear.bias is None else linear.bias.data_ptr()
    if launch(x.data_ptr(), out.data_ptr(), rows, bias, torch.get_num_threads()) != 0:
        raise RuntimeError(f"{name}: this build of the kernels has no AVX-512 linear")
    return out
