"""The native kernels over the paged KV cache (generation/kv_cache.py): decode attention, the fused rotary +
cache write + attention step, and the cache write, with each row's keys found through its block table.

Same library as generation/cpu/native.py (csrc/engine_kernels.cpp, ``provmark_paged_*``): the attention
arithmetic is the slot kernels' own, in the same order (only where a key row is read from differs), so a
paged step gives the slot step's output bit for bit (tests/test_paged.py checks it).

Layout: ``keys``/``values`` ``[num_blocks, kv_heads, block_size, head_dim]`` (block_size a power of two,
contiguous in head_dim); ``tables`` int64 ``[B, W]``: row b's position p lives at row ``p % block_size`` of
block ``tables[b, p // block_size]``.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from generation.cpu import native

_I64, _PTR, _F32, _I32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
_SIGNATURES = {
    "provmark_paged_rope_cache_attention": [_I32, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64,
                                            _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _I32],
    "provmark_paged_decode_attention": [_I32, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR,
                                        _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _F32, _I32],
    "provmark_paged_cache_write": [_I32, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _I64,
                                   _PTR, _I64, _I64, _PTR, _I64, _I64, _I64],
}


@functools.cache
def _library() -> ctypes.CDLL:
    lib = native._checked_library()
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return lib


def _pool_args(keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor, user: str) -> tuple:
    """(block stride, head stride, row stride, log2 block size, blocks, tables pointer, table stride)."""
    block_size = keys.shape[2]
    if (keys.dim() != 4 or keys.shape != values.shape or keys.stride() != values.stride() or keys.stride(-1) != 1
            or block_size & (block_size - 1)):
        raise ValueError(f"{user}: the cache {tuple(keys.shape)} is not [blocks, kv_heads, 2**k, head_dim] pools")
    if tables.dtype != torch.int64 or tables.dim() != 2 or not tables.is_contiguous():
        raise ValueError(f"{user}: block tables must be a contiguous int64 [rows, blocks] tensor")
    return (keys.stride(0), keys.stride(1), keys.stride(2), block_size.bit_length() - 1, keys.shape[0],
            tables.data_ptr(), tables.shape[1])


def _rows(tensor: torch.Tensor, batch: int, user: str) -> None:
    if tensor.dtype != torch.int64 or not tensor.is_contiguous() or tensor.numel() != batch:
        raise ValueError(f"{user}: positions/lengths must be a contiguous int64 tensor with one entry per row")


def rope_cache_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                         values: torch.Tensor, tables: torch.Tensor, positions: torch.Tensor, heads: int,
                         scale: float) -> torch.Tensor:
    """native.rope_cache_attention over the paged cache: rotary embedding of q and k, k and v written at
    ``positions[b]`` of row b's blocks, attention of row b over its ``positions[b] + 1`` keys; [B, 1, heads * D]."""
    code = native._code(qkv, cos, sin, keys, values)
    batch = qkv.shape[0]
    kv_heads, dim = keys.shape[1], keys.shape[3]
    if (qkv.dim() != 3 or qkv.shape[1] != 1 or qkv.shape[2] != (heads + 2 * kv_heads) * dim or qkv.stride(-1) != 1
            or cos.shape != (batch, 1, dim) or sin.shape != cos.shape or not cos.is_contiguous()
            or not sin.is_contiguous() or heads % kv_heads or tables.shape[0] != batch):
        raise ValueError(f"paged rope_cache_attention: qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)} and cache "
                         f"{tuple(keys.shape)} do not fit {heads} heads")
    pool = _pool_args(keys, values, tables, "paged rope_cache_attention")
    _rows(positions, batch, "paged rope_cache_attention")
    out = torch.empty((batch, 1, heads * dim), dtype=qkv.dtype)
    rc = _library().provmark_paged_rope_cache_attention(
        code, qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), dim, keys.data_ptr(), values.data_ptr(),
        *pool, positions.data_ptr(), out.data_ptr(), batch, heads, kv_heads, dim, float(scale),
        torch.get_num_threads())
    if rc != 0:
        raise ValueError("paged rope_cache_attention: a position lies outside its row's blocks")
    return out


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor,
                     lengths: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """native.decode_attention over the paged cache: row b's one query token over its first ``lengths[b]``
    keys; ``query`` [B, H, 1, D]; returns [B, 1, H, D]."""
    batch, heads, q_len, dim = query.shape
    kv_heads = keys.shape[1]
    if q_len != 1 or heads % kv_heads or keys.shape[3] != dim or tables.shape[0] != batch:
        raise ValueError(f"paged decode_attention: query {tuple(query.shape)} / cache {tuple(keys.shape)} do not fit")
    code = native._code(query, keys, values)
    if query.stride(-1) != 1:
        query = query.contiguous()
    pool = _pool_args(keys, values, tables, "paged decode_attention")
    _rows(lengths, batch, "paged decode_attention")
    out = torch.empty((batch, 1, heads, dim), dtype=query.dtype)
    scale = dim ** -0.5 if scale is None else float(scale)
    rc = _library().provmark_paged_decode_attention(
        code, query.data_ptr(), query.stride(0), query.stride(1), keys.data_ptr(), values.data_ptr(), *pool,
        lengths.data_ptr(), out.data_ptr(), batch, heads, kv_heads, dim, scale, torch.get_num_threads())
    if rc != 0:
        raise ValueError("paged decode_attention: a length lies outside its row's blocks")
    return out


def cache_write(keys: torch.Tensor, values: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                tables: torch.Tensor, positions: torch.Tensor) -> None:
    """Write row b's new key/value ([B, KV, 1, D]) at ``positions[b]`` of its blocks."""
    code = native._code(keys, values, new_keys, new_values)
    batch, kv_heads, _, dim = new_keys.shape
    if (new_keys.shape != new_values.shape or new_keys.shape[2] != 1 or new_keys.stride(-1) != 1
            or new_values.stride(-1) != 1 or keys.shape[1] != kv_heads or keys.shape[3] != dim
            or tables.shape[0] != batch):
        raise ValueError(f"paged cache_write: new keys {tuple(new_keys.shape)} do not fit the cache {tuple(keys.shape)}")
    pool = _pool_args(keys, values, tables, "paged cache_write")
    _rows(positions, batch, "paged cache_write")
    rc = _library().provmark_paged_cache_write(
        code, keys.data_ptr(), values.data_ptr(), *pool, new_keys.data_ptr(), new_keys.stride(0), new_keys.stride(1),
        new_values.data_ptr(), new_values.stride(0), new_values.stride(1), positions.data_ptr(), batch, kv_heads, dim)
    if rc != 0:
        raise ValueError("paged cache_write: a position lies outside its row's blocks")
