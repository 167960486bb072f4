"""Decode attention through the block tables in torch ops, for devices without the native kernels (CUDA).

A decode step attends row b's one new token to its first ``lengths[b]`` keys, which live in the blocks
``tables[b]`` of the paged pools (generation/kv_cache.py, ``[num_blocks, kv_heads, block_size, head_dim]``).
The native CPU kernels (generation/cpu/paged_native.py) read those rows in place; here the blocks a batch
names are picked out of the pool with one ``index_select`` per pool (``[B, kv_heads, W * block_size, D]``,
W the table width the runner passes: the batch's longest row, or a CUDA graph's bucket) and one
``F.scaled_dot_product_attention`` runs over them with a key-length mask. The query heads sharing a key/value
head are packed as a G-row query against it (no ``repeat_kv`` copy of the keys), so the copy is of the
key/value heads only, never a ``[B, heads, max_model_len, D]`` tensor.

It is registered with transformers' AttentionInterface under ``ATTENTION_NAME`` and used only by the engine's
own view of the model (``shared_view``: the module tree again, sharing every parameter and buffer; the loaded
model itself is left untouched). transformers' SDPA mask function is registered under that name too: a decode
step passes no mask, and transformers makes none for one query token (the rows' lengths are the mask);
prefill passes its own 4-D mask and goes to transformers' SDPA attention unchanged (on CUDA, SDPA picks its
flash or memory-efficient kernel itself), as does anything else run through the view.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "provmark_block_table_sdpa"
ROWS_KWARG = "provmark_block_table_rows"


@dataclass(frozen=True, slots=True)
class BlockTableRows:
    """Row b attends to its first ``lengths[b]`` keys (int64 [B]), found through ``tables[b]`` (int64 [B, W])."""

    tables: torch.Tensor
    lengths: torch.Tensor


def gather_blocks(pool: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The blocks each row names, in table order: pool [N, KV, bs, D], tables [B, W] -> [B, KV, W * bs, D]
    (one copy, of the named blocks only; a strided view whose last dimension is contiguous)."""
    rows, width = tables.shape
    _, kv_heads, block_size, dim = pool.shape
    picked = pool.transpose(0, 1).index_select(1, tables.reshape(-1))  # [KV, B * W, bs, D], contiguous
    return picked.view(kv_heads, rows, width * block_size, dim).transpose(0, 1)


def length_mask(lengths: torch.Tensor, keys: int) -> torch.Tensor:
    """Bool [B, 1, 1, keys]: True where key j < lengths[b] (row b attends to it)."""
    return (torch.arange(keys, device=lengths.device)[None, :] < lengths[:, None])[:, None, None, :]


def block_table_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tables: torch.Tensor,
                          lengths: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Row b's query [B, H, 1, D] over its first ``lengths[b]`` keys of the pools ``keys``/``values``
    ([N, KV, bs, D]) through ``tables`` [B, W]; returns [B, 1, H, D]. Every length must be in 1..W * bs."""
    batch, heads, q_len, dim = query.shape
    kv_heads = keys.shape[1]
    if q_len != 1 or heads % kv_heads or keys.shape[3] != dim or tables.shape[0] != batch or lengths.shape != (batch,):
        raise ValueError(f"block_table_attention: query {tuple(query.shape)}, pool {tuple(keys.shape)}, tables "
                         f"{tuple(tables.shape)} and lengths {tuple(lengths.shape)} do not fit")
    k, v = gather_blocks(keys, tables), gather_blocks(values, tables)
    packed = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # heads h = kv * G + j, as repeat_kv
    out = F.scaled_dot_product_attention(packed, k, v, attn_mask=length_mask(lengths, k.shape[2]), scale=scale)
    return out.reshape(batch, 1, heads, dim)


def block_table_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               attention_mask: torch.Tensor | None, dropout: float = 0.0,
                               scaling: float | None = None, **kwargs):
    """transformers attention-function signature; a decode step with ``BlockTableRows`` reads the pools
    (``key``/``value`` are then the cache's pools themselves), anything else is transformers' SDPA."""
    rows: BlockTableRows | None = kwargs.pop(ROWS_KWARG, None)
    if rows is None or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return block_table_attention(query, key, value, rows.tables, rows.lengths, scaling), None


def shared_view(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree (and config) sharing every parameter and buffer: no weight is copied."""
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo=shared).eval()


def use_block_table_attention_(view: nn.Module) -> bool:
    """Point the view's config at the block-table attention; False (nothing changed) if it is not SDPA-based."""
    config = view.config
    if getattr(config, "_attn_implementation", None) not in ("sdpa", ATTENTION_NAME):
        return False
    AttentionInterface.register(ATTENTION_NAME, block_table_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    config._attn_implementation = ATTENTION_NAME
    return True
