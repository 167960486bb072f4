"""The engine's native CPU kernels: built once with the system C++ compiler, called through ctypes.

``csrc/engine_kernels.cpp`` holds the decode attention (here over one buffer per row; the engine's paged
cache goes through generation/cpu/paged_native.py), the cache write, RMSNorm and silu(gate) * up: the
pieces of a decode step where torch either streams the cache slowly (SDPA for one query token) or spends
its time dispatching many tiny ops. It is a plain C-ABI shared library (no torch headers, so it builds in
about three seconds): ``g++ -O3 -march=native -fopenmp``. It links the same ``libgomp.so.1`` soname torch has
already loaded, so its threads are torch's OpenMP threads, not a second pool. The built library is cached
under ``$PROVMARK_KERNEL_DIR`` (default ``~/.cache/provmark/kernels``), named by a hash of the source,
the flags, the compiler and this CPU's feature flags; a build writes a temporary file and renames it, so
processes building at once never load half a library.

Nothing depends on it being there: without a compiler (or with ``PROVMARK_NATIVE=0``) ``available()`` is
False and the engine keeps transformers' own modules and SDPA. Only CPU float32 and bfloat16 are handled.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
from pathlib import Path

import torch

from watermark.native_build import build_cached
from watermark.prf import SEED_MULTIPLIER

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "engine_kernels.cpp"
# -ffp-contract=off: no fused multiply-adds where torch rounds a product before adding (rotary embedding)
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-std=c++20", "-ffp-contract=off", "-shared",
         "-fPIC")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
DISABLE_ENV = "PROVMARK_NATIVE"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _compiler() -> str | None:
    chosen = os.environ.get("CXX")
    if chosen:
        return shutil.which(chosen)
    return shutil.which("g++") or shutil.which("c++")


def build(force: bool = False) -> Path:
    """Compile the kernel if this source/compiler/CPU has no cached build; the library's path.

    Raises RuntimeError (with the compiler's message) when no compiler is found or the build fails."""
    compiler = _compiler()
    if compiler is None:
        named = f"CXX={os.environ['CXX']} is not an executable; " if os.environ.get("CXX") else ""
        raise RuntimeError(f"{named}no C++ compiler found (install g++, e.g. `apt-get install g++`)")
    return build_cached(compiler, SOURCE, FLAGS, "engine_kernels", salt=_cpu_flags(), force=force)


def _checked_library() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise RuntimeError("the native engine kernels are not available (see generation/cpu/native.py)")
    return lib


def _code(*tensors: torch.Tensor) -> int:
    """The kernels' dtype code; ValueError unless all are CPU tensors of one supported dtype (hot path: a
    plain loop, no generator)."""
    dtype = tensors[0].dtype
    code = DTYPE_CODES.get(dtype)
    ok = code is not None
    for t in tensors:
        if t.dtype is not dtype or not t.is_cpu:
            ok = False
            break
    if not ok:
        raise ValueError(f"native kernels take CPU float32/bfloat16 tensors of one dtype, got "
                         f"{sorted({str(t.dtype) for t in tensors})} on {sorted({t.device.type for t in tensors})}")
    return code


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, RuntimeError) as exc:
        log.warning("native engine kernels unavailable, using torch ops: %s", exc)
        return None
    i64, ptr, f32, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    signatures = {
        "provmark_decode_attention": [i32, ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, i64, ptr, i64, i64, i64,
                                      i64, f32, i32],
        "provmark_rope_cache_attention": [i32, ptr, i64, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, ptr, ptr,
                                          i64, i64, i64, i64, f32, i32],
        "provmark_cache_write": [i32, ptr, ptr, i64, i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, i64, i64],
        "provmark_rms_norm": [i32, ptr, i64, ptr, f32, ptr, i64, i64],
        "provmark_silu_mul": [i32, ptr, i64, i64, ptr, i64],
        "provmark_watermark_bias": [ptr, i64, i64, i32, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, f32, ptr, i32, i32],
        "provmark_gumbel_survivors": [ptr, i64, i64, ptr, ptr, i64, ctypes.c_double, i64, ptr, ptr, i32],
        "provmark_top_head": [ptr, i64, i64, i64, i64, ptr, ptr, ptr, i32],
        "provmark_synthid_tournament": [ptr, i64, i64, ptr, i64, i32],
        "provmark_pack_linear": [i32, ptr, i64, ptr, i64, i64],
        "provmark_linear": [i32, ptr, ptr, ptr, ptr, i64, i64, i64, i32],
        "provmark_gemv": [i32, ptr, ptr, ptr, ptr, i64, i64, i32],
        "provmark_linear_q8": [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i32],
        "provmark_decode_stack": [i32, ptr, i64, ptr, ptr, ptr, f32, ptr, ptr, i64, i64, i64, i64, i64, ptr, i64, ptr,
                                  i64, i64, i64, i64, f32, i32],
    }
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """True when the kernels are built (or can be) and handle tensors of this dtype on this device."""
    return torch.device(device).type == "cpu" and dtype in DTYPE_CODES and _library() is not None


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, lengths: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """Attention of one query token per row over that row's first ``lengths[b]`` keys.

    ``query`` [B, H, 1, D]; ``key``/``value`` [B, KV, >= max(lengths), D] (views into the slot cache,
    same strides); ``lengths`` int64 [B], each in ``1..key.shape[2]``. Returns [B, 1, H, D], the layout
    transformers' attention modules expect back."""
    lib = _checked_library()
    batch, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    if (q_len != 1 or key.shape != value.shape or key.stride() != value.stride() or heads % kv_heads
            or key.shape[0] < batch or key.shape[3] != dim):
        raise ValueError(f"decode_attention: query {tuple(query.shape)} / keys {tuple(key.shape)} do not fit")
    code = _code(query, key, value)
    if query.stride(-1) != 1:
        query = query.contiguous()
    if key.stride(-1) != 1 or lengths.dtype != torch.int64 or not lengths.is_contiguous() or lengths.numel() != batch:
        raise ValueError("decode_attention: keys must be contiguous in the head dimension, lengths int64 [B]")
    out = torch.empty((batch, 1, heads, dim), dtype=query.dtype)
    scale = dim ** -0.5 if scale is None else float(scale)
    rc = lib.provmark_decode_attention(
        code, query.data_ptr(), query.stride(0), query.stride(1), key.data_ptr(),
        value.data_ptr(), key.stride(0), key.stride(1), key.stride(2), lengths.data_ptr(), key.shape[2],
        out.data_ptr(), batch, heads, kv_heads, dim, scale, torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"decode_attention: every length must be in 1..{key.shape[2]} (the keys given)")
    return out


def cache_write(keys: torch.Tensor, values: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                positions: torch.Tensor) -> None:
    """Write row b's new key/value ([B, KV, 1, D]) at ``positions[b]`` of slot b of ``keys``/``values``
    ([S, KV, T, D] buffers, contiguous in D); ValueError for a position outside ``0..T-1``."""
    code = _code(keys, values, new_keys, new_values)
    batch, kv_heads, _, dim = new_keys.shape
    if (keys.shape != values.shape or keys.stride() != values.stride() or new_keys.shape != new_values.shape
            or keys.stride(-1) != 1 or new_keys.stride(-1) != 1 or new_values.stride(-1) != 1
            or new_keys.shape[2] != 1 or keys.shape[1] != kv_heads or keys.shape[3] != dim or batch > keys.shape[0]):
        raise ValueError(f"cache_write: new keys {tuple(new_keys.shape)} do not fit the cache {tuple(keys.shape)}")
    if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.numel() != batch:
        raise ValueError("cache_write: positions must be a contiguous int64 tensor with one entry per row")
    rc = _checked_library().provmark_cache_write(
        code, keys.data_ptr(), values.data_ptr(), keys.stride(0), keys.stride(1), keys.stride(2), keys.shape[2],
        new_keys.data_ptr(), new_keys.stride(0), new_keys.stride(1), new_values.data_ptr(), new_values.stride(0),
        new_values.stride(1), positions.data_ptr(), batch, kv_heads, dim)
    if rc != 0:
        raise ValueError(f"cache_write: every position must be in 0..{keys.shape[2] - 1}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x**2) + eps))`` over the last dimension, in LlamaRMSNorm's order of operations
    (the norm in fp32, rounded to x's dtype before the weight multiplies)."""
    code = _code(x, weight)
    dim = x.shape[-1]
    if weight.dim() != 1 or weight.shape[0] != dim or not weight.is_contiguous():
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not fit inputs of width {dim}")
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty_like(x)
    rc = _checked_library().provmark_rms_norm(code, x.data_ptr(), dim, weight.data_ptr(), eps, out.data_ptr(),
                                              x.numel() // dim, dim)
    if rc != 0:
        raise ValueError("rms_norm: the kernel rejected its arguments")
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up`` is [..., 2 * I] with the gate in the first I columns; [..., I].
    Each op's result is rounded to the input dtype, as torch's two ops would."""
    code = _code(gate_up)
    width = gate_up.shape[-1]
    if width % 2:
        raise ValueError(f"silu_mul: last dimension {width} is not gate and up of one width")
    if not gate_up.is_contiguous():
        gate_up = gate_up.contiguous()
    out = torch.empty((*gate_up.shape[:-1], width // 2), dtype=gate_up.dtype)
    rc = _checked_library().provmark_silu_mul(code, gate_up.data_ptr(), width, width // 2, out.data_ptr(),
                                              gate_up.numel() // width)
    if rc != 0:
        raise ValueError("silu_mul: the kernel rejected its arguments")
    return out


def rope_cache_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, positions: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    """A Llama-style attention block's decode step after its fused q/k/v matmul, in one call.

    ``qkv`` [B, 1, (heads + 2 * KV) * D] (q, k, v side by side); ``cos``/``sin`` [B, 1, D] from the
    model's rotary embedding; ``keys``/``values`` the layer's [S, KV, T, D] slot buffers. Applies the
    rotary embedding to q and k, writes k and v at ``positions[b]`` of slot b, attends each row to its
    ``positions[b] + 1`` keys; returns [B, 1, heads * D], ready for ``o_proj``."""
    code = _code(qkv, cos, sin, keys, values)
    batch = qkv.shape[0]
    _, kv_heads, max_len, dim = keys.shape
    if (qkv.dim() != 3 or qkv.shape[1] != 1 or qkv.shape[2] != (heads + 2 * kv_heads) * dim or qkv.stride(-1) != 1
            or cos.shape != (batch, 1, dim) or sin.shape != cos.shape or not cos.is_contiguous()
            or not sin.is_contiguous() or keys.shape != values.shape or keys.stride() != values.stride()
            or keys.stride(-1) != 1 or batch > keys.shape[0] or heads % kv_heads):
        raise ValueError(f"rope_cache_attention: qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)} and cache "
                         f"{tuple(keys.shape)} do not fit {heads} heads")
    if positions.dtype != torch.int64 or not positions.is_contiguous() or positions.numel() != batch:
        raise ValueError("rope_cache_attention: positions must be a contiguous int64 tensor with one entry per row")
    out = torch.empty((batch, 1, heads * dim), dtype=qkv.dtype)
    rc = _checked_library().provmark_rope_cache_attention(
        code, qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), dim, keys.data_ptr(), values.data_ptr(),
        keys.stride(0), keys.stride(1), keys.stride(2), max_len, positions.data_ptr(), out.data_ptr(), batch, heads,
        kv_heads, dim, float(scale), torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"rope_cache_attention: every position must be in 0..{max_len - 1}")
    return out


def watermark_bias(logits: torch.Tensor, seeds: torch.Tensor | None, context_values: torch.Tensor | None,
                   salt: torch.Tensor | None, own: torch.Tensor | None, token_mix: torch.Tensor, threshold: int,
                   delta: float | torch.Tensor, hard: bool) -> bool:
    """watermark.greenlist's bias backend: the same integers as its tensor code, one pass in C++.

    ``seeds`` [B, 1] (per-row schemes) or ``context_values`` [B, h] with ``salt``/``own`` [V] (selfhash);
    ``token_mix`` [1, V]; ``delta`` one float, or float32 [B], each row's own. Returns False, untouched, for what
    it does not take (not contiguous CPU float32 logits, a kernel build without it)."""
    lib = _library()
    batch, vocab = logits.shape if logits.dim() == 2 else (0, 0)
    if (lib is None or logits.dtype is not torch.float32 or not logits.is_cpu or not logits.is_contiguous()
            or vocab == 0 or token_mix.numel() != vocab):
        return False
    mix = token_mix.contiguous()
    if seeds is not None:
        row_seeds = seeds.reshape(-1).contiguous()
        if row_seeds.numel() != batch:
            return False
        args = (0, row_seeds.data_ptr(), None, 0, None, None)
        keep = (row_seeds,)
    else:
        ctx = context_values.contiguous()
        salt, own = salt.contiguous(), own.contiguous()
        if ctx.shape[0] != batch or salt.numel() != vocab or own.numel() != vocab:
            return False
        args = (1, None, ctx.data_ptr(), ctx.shape[1], salt.data_ptr(), own.data_ptr())
        keep = (ctx, salt, own)
    row_deltas = None
    if isinstance(delta, torch.Tensor):
        row_deltas = delta.to(torch.float32).reshape(-1).contiguous()
        if row_deltas.numel() != batch or not row_deltas.is_cpu:
            return False
        delta = 0.0
    rc = lib.provmark_watermark_bias(logits.data_ptr(), batch, vocab, *args, mix.data_ptr(), SEED_MULTIPLIER,
                                     int(threshold), float(delta),
                                     None if row_deltas is None else row_deltas.data_ptr(), int(bool(hard)),
                                     torch.get_num_threads())
    del keep, row_deltas
    return rc == 0


def gumbel_survivors(probs: torch.Tensor, seeds: torch.Tensor, token_mix: torch.Tensor,
                     slack: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """watermark.gumbel's survivors backend: (rows, token ids) of the tokens that can still win each row's
    race, row-major and ascending, from one C++ pass; None for what it does not take."""
    lib = _library()
    if (lib is None or probs.dim() != 2 or probs.dtype is not torch.float32 or not probs.is_cpu
            or not probs.is_contiguous() or token_mix.numel() != probs.shape[1]):
        return None
    rows, vocab = probs.shape
    row_seeds = seeds.reshape(-1).to(torch.int64).contiguous()
    if row_seeds.numel() != rows:
        return None
    mix = token_mix.reshape(-1).contiguous()
    idx = torch.empty((rows, vocab), dtype=torch.int64)  # room for every token: a flat row never overflows
    counts = torch.empty(rows, dtype=torch.int64)
    rc = lib.provmark_gumbel_survivors(probs.data_ptr(), rows, vocab, row_seeds.data_ptr(), mix.data_ptr(),
                                       SEED_MULTIPLIER, float(slack), vocab, idx.data_ptr(), counts.data_ptr(),
                                       torch.get_num_threads())
    if rc != 0:
        return None
    kept = counts.tolist()
    return (torch.arange(rows).repeat_interleave(counts),
            torch.cat([idx[b, :n] for b, n in enumerate(kept)]))


def top_head(scores: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """generation.sample.top_head's backend: (values [B, size], ids [B, size], ok [B] bool) where row b's
    values and ids equal ``scores[b].topk(size)``'s when ok[b] (its top size + 1 values are distinct);
    None for what it does not take (not CPU float32 rows with unit column stride)."""
    lib = _library()
    if (lib is None or scores.dim() != 2 or scores.dtype is not torch.float32 or not scores.is_cpu
            or scores.stride(1) != 1 or scores.shape[1] < 1 or size < 1):
        return None
    rows, vocab = scores.shape
    values = torch.empty((rows, size), dtype=torch.float32)
    ids = torch.empty((rows, size), dtype=torch.int64)
    ok = torch.empty(rows, dtype=torch.bool)
    rc = lib.provmark_top_head(scores.data_ptr(), rows, vocab, scores.stride(0) if rows > 1 else vocab, size,
                               values.data_ptr(), ids.data_ptr(), ok.data_ptr(), torch.get_num_threads())
    return (values, ids, ok) if rc == 0 else None


def synthid_tournament(probs: torch.Tensor, words: torch.Tensor, layers: int) -> torch.Tensor | None:
    """watermark.synthid's tournament backend: ``sequential_tournament(probs, words, layers)``, equal bit
    for bit, for CPU float32 probabilities [B, C] and int64 words [B, C]; None for anything else."""
    lib = _library()
    if (lib is None or probs.dim() != 2 or probs.dtype is not torch.float32 or not probs.is_cpu
            or words.shape != probs.shape or words.dtype is not torch.int64 or not words.is_cpu
            or not 0 <= layers <= 64):
        return None
    out = probs.contiguous().clone()
    words = words.contiguous()
    rc = lib.provmark_synthid_tournament(out.data_ptr(), out.shape[0], out.shape[1], words.data_ptr(), layers,
                                         torch.get_num_threads())
    return out if rc == 0 else None


if __name__ == "__main__":  # `python -m generation.cpu.native`: build now (make install does), report where
    import sys

    try:
        print(build())
    except RuntimeError as exc:
        print(f"provmark: native kernels not built, the engine will use torch ops: {exc}", file=sys.stderr)
        sys.exit(1)
