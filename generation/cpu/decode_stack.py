"""A decode step's layers in one native call (``provmark_decode_stack`` in csrc/engine_kernels.cpp).

generation/cpu/direct_decode.py runs the step as a Python loop: per layer eight kernel calls through
ctypes and a few torch ops (residual adds, new tensors), about 250 calls a step for the default model's 30
layers. At one row a call costs a few microseconds whatever its work, so that loop's fixed cost was a
fifth of a batch-1 step on top of the linears' weight streaming. ``NativeStack`` hands the whole layer
stack to C++ once per step: the same kernels, the same dispatch (1-row kernel or tiles), the same order
and the same roundings, so the hidden states are the loop's bits (tests/test_decode_stack.py).

The layers' pointers (packed weights, norms, the cache's pools) are gathered once, at construction; a cache
whose pools move is noticed (the first pool's address) and the table is rebuilt.
"""

from __future__ import annotations

import ctypes

import torch

from generation.cpu import native
from generation.kv_cache import PagedKVCache


class LinearRef(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("n", ctypes.c_int64), ("k", ctypes.c_int64), ("gemv_rows", ctypes.c_int64)]


class DecodeLayer(ctypes.Structure):
    _fields_ = [("qkv", LinearRef), ("o", LinearRef), ("gate_up", LinearRef), ("down", LinearRef),
                ("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("keys", ctypes.c_void_p),
                ("values", ctypes.c_void_p)]


class NativeStack:
    """``layers`` (DirectDecode's: NativeAttention, NativeGatedMLP, two NativeRMSNorm each, every linear with a
    decode kernel) and the final ``norm`` as one native call per step."""

    def __init__(self, layers: list, norm, cache: PagedKVCache, dtype: torch.dtype) -> None:
        attn = layers[0].self_attn
        self.heads, self.scale = attn.heads, attn.scaling
        eps = {layer.input_layernorm.variance_epsilon for layer in layers}
        eps |= {layer.post_attention_layernorm.variance_epsilon for layer in layers} | {norm.variance_epsilon}
        if len(eps) != 1 or {(layer.self_attn.heads, layer.self_attn.scaling) for layer in layers} != {
                (self.heads, self.scale)}:
            raise ValueError("NativeStack: the layers differ in their norms' epsilon or their attention's shape")
        self.eps, self.layers, self.norm, self.cache = eps.pop(), layers, norm, cache
        self.code = native.DTYPE_CODES[dtype]
        self._fn = native._checked_library().provmark_decode_stack
        self._table, self._pool_at = None, None
        self._build()

    def _build(self) -> None:
        table = (DecodeLayer * len(self.layers))()
        kernels = []  # held here too: the table's raw pointers must outlive any swap of a layer's kernel
        for entry, layer in zip(table, self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            pool = self.cache.layers[attn.layer_idx]
            layer_kernels = (attn.q_proj.group.decode_kernel, attn.o_proj.decode_kernel,
                             mlp.gate_proj.group.decode_kernel, mlp.down_proj.decode_kernel)
            kernels.extend(layer_kernels)
            entry.qkv, entry.o, entry.gate_up, entry.down = (LinearRef(*k.ref()) for k in layer_kernels)
            entry.input_norm = layer.input_layernorm.weight.data_ptr()
            entry.post_norm = layer.post_attention_layernorm.weight.data_ptr()
            entry.keys, entry.values = pool.keys.data_ptr(), pool.values.data_ptr()
        self._table, self._kernels = table, kernels
        self._pool_at = self.cache.layers[0].keys.data_ptr()

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, tables: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        """The final norm's output [B, D] for ``hidden`` [B, 1, D] (the embedded tokens, updated in place) with
        rotary ``cos``/``sin`` [B, 1, head_dim] at ``positions`` [B] through block ``tables`` [B, W]."""
        if self._table is None or self._pool_at != self.cache.layers[0].keys.data_ptr():
            self._build()
        keys = self.cache.layers[0].keys
        batch, width = hidden.shape[0], hidden.shape[-1]
        if (not hidden.is_contiguous() or not cos.is_contiguous() or not sin.is_contiguous()
                or tables.dtype != torch.int64 or not tables.is_contiguous() or positions.dtype != torch.int64
                or not positions.is_contiguous() or positions.numel() != batch or tables.shape[0] != batch):
            raise ValueError("NativeStack: hidden states, rotary tables, block tables or positions are not laid out "
                             "as the kernel reads them")
        out = torch.empty((batch, width), dtype=hidden.dtype)
        rc = self._fn(self.code, self._table, len(self.layers), hidden.data_ptr(), self.norm.weight.data_ptr(),
                      out.data_ptr(), self.eps, cos.data_ptr(), sin.data_ptr(), keys.stride(0), keys.stride(1),
                      keys.stride(2), keys.shape[2].bit_length() - 1, keys.shape[0], tables.data_ptr(),
                      tables.shape[1], positions.data_ptr(), batch, self.heads, keys.shape[1], keys.shape[3],
                      float(self.scale), torch.get_num_threads())
        if rc != 0:
            raise ValueError("NativeStack: the kernel rejected the step (a position outside its row's blocks, or "
                             "layers it does not take)")
        return out
