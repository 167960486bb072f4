"""A decode step of the engine's native view straight through its layers, without transformers' module plumbing.

Transformers' forward around the kernels (the model's output-capturing decorators, the causal-mask
helper, each decoder layer's and each submodule's ``__call__``, keyword plumbing) took about a tenth of a
batch-1 step in benchmarks/batch1_step.py (the kernels' own time left out: 3.6 of 32.6 ms at 2 threads,
9.3 of 45.2 ms at 1, on a busy machine; 2.5 and 5.6 ms through this loop). ``DirectDecode`` runs the
same step as a plain loop: per layer the same calls in the same order (the native RMSNorm, the fused
q/k/v matmul, the paged rotary + cache write + attention kernel, ``o_proj``, the residual add, the native
RMSNorm, the gated MLP, the residual add), then the final norm. Every number is computed by the same
kernel as through the modules, so the hidden states are the same bits (tests/test_direct_decode.py).

It is built only for a view whose every layer is Llama's layout with every native swap in place
(generation/cpu/native_layers.py: ``NativeAttention``, ``NativeRMSNorm`` twice, ``NativeGatedMLP``) and
a decode kernel on every linear; otherwise ``DirectDecode.of`` returns None and the runner keeps the
module forward.
"""

from __future__ import annotations

import torch
from torch import nn

from generation.cpu import paged_native
from generation.cpu.decode_stack import NativeStack
from generation.cpu.native_layers import NativeAttention, NativeGatedMLP, NativeRMSNorm
from generation.kv_cache import PagedKVCache

LAYER_CLASSES = frozenset({"LlamaDecoderLayer"})
MODEL_CLASSES = frozenset({"LlamaModel"})


def _direct_layer(layer: nn.Module) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (type(layer).__name__ in LAYER_CLASSES and type(attn) is NativeAttention and type(mlp) is NativeGatedMLP
            and type(getattr(layer, "input_layernorm", None)) is NativeRMSNorm
            and type(getattr(layer, "post_attention_layernorm", None)) is NativeRMSNorm
            and attn.q_proj.group.decode_kernel is not None and mlp.gate_proj.group.decode_kernel is not None
            and getattr(attn.o_proj, "decode_kernel", None) is not None
            and getattr(mlp.down_proj, "decode_kernel", None) is not None)


class DirectDecode:
    """``decoder``'s decode step (hidden states after the final norm): its layers in one native call
    (``NativeStack``), or as a plain loop over their kernels."""

    def __init__(self, decoder: nn.Module, cache: PagedKVCache, native_stack: bool = True) -> None:
        """``native_stack``: the layers run as one native call (generation/cpu/decode_stack.py, the same bits);
        False keeps the Python loop over the kernels (the reference the tests hold the stack to)."""
        self.embed, self.rotary, self.norm = decoder.embed_tokens, decoder.rotary_emb, decoder.norm
        self.layers = list(decoder.layers[: decoder.config.num_hidden_layers])
        self.cache = cache
        self.stack = NativeStack(self.layers, self.norm, cache, self.embed.weight.dtype) if native_stack else None
        # the rows up to which every linear runs its decode kernel (beyond, the module forward is kept)
        self.max_rows = min(min(layer.self_attn.q_proj.group.decode_kernel_rows,
                                layer.mlp.gate_proj.group.decode_kernel_rows,
                                layer.self_attn.o_proj.decode_kernel_rows,
                                layer.mlp.down_proj.decode_kernel_rows) for layer in self.layers)

    @classmethod
    def of(cls, decoder: nn.Module, cache: PagedKVCache, native_stack: bool = True) -> DirectDecode | None:
        """The direct step for ``decoder`` (the runner's native view), or None when any part is not the layout
        it reproduces."""
        layers = getattr(decoder, "layers", None)
        if (type(decoder).__name__ not in MODEL_CLASSES or layers is None
                or type(getattr(decoder, "norm", None)) is not NativeRMSNorm
                or not isinstance(getattr(decoder, "embed_tokens", None), nn.Embedding)
                or getattr(decoder, "rotary_emb", None) is None
                or len(layers) != decoder.config.num_hidden_layers
                or not all(_direct_layer(layer) for layer in layers)):
            return None
        return cls(decoder, cache, native_stack)

    def takes(self, rows: int, dtype: torch.dtype) -> bool:
        return 0 < rows <= self.max_rows and dtype == self.embed.weight.dtype

    def __call__(self, token_ids: torch.Tensor, pos: torch.Tensor, table_t: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, D] after the final norm for ``token_ids`` [B] at ``pos`` [B] through the block
        tables ``table_t``: every row's key and value written into the cache, as the module forward does."""
        hidden = self.embed(token_ids[:, None])
        cos, sin = self.rotary(hidden, position_ids=pos[:, None])
        if self.stack is not None:
            return self.stack(hidden, cos, sin, table_t, pos)
        pools = self.cache.layers
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.q_proj.group.compute(layer.input_layernorm.forward(hidden))
            pool = pools[attn.layer_idx]
            out = paged_native.rope_cache_attention(qkv, cos, sin, pool.keys, pool.values, table_t, pos, attn.heads,
                                                    attn.scaling)
            hidden = hidden + attn.o_proj.forward(out)
            hidden = hidden + mlp.forward(layer.post_attention_layernorm.forward(hidden))
        return self.norm.forward(hidden)[:, 0]
