"""Decode attention that reads each row's keys only as far as its group needs.

A decode step attends row i to ``positions[i] + 1`` cached keys, but one SDPA call over the batch has to
read every row up to the longest one: with the benchmark's prompts of 10..200 tokens, over half the keys
and values it streams from memory are masked out. Decode attention is memory-bound here (about 8 GB/s
of cached keys and values on a 2-core Sapphire Rapids CPU), so the runner splits the rows (contiguous in the batch) into at
most two groups where that saves enough reading, and this attention function runs one SDPA call per
group, each over its own key length. Query heads sharing a key/value head are packed as a 3-row query
against that head (no ``repeat_kv`` copy, no ``enable_gqa`` path).

Where the native kernel is built (generation/cpu/paged_native.py, CPU float32/bfloat16) the runner passes
each row's key count and block table instead of groups (``RowLengths``); the cache then hands attention
its block pools and the kernel reads exactly each row's keys through its table, no SDPA. Otherwise the
cache hands over each row's keys gathered from its blocks, and the groups slice those.

It is registered with transformers' AttentionInterface under ``ATTENTION_NAME`` and used only by the
engine's own view of the model (generation/cpu/packed_linear.py makes that view). Anything but a decode step
with groups or row lengths goes to transformers' own SDPA attention unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from generation.cpu import paged_native

ATTENTION_NAME = "provmark_slot_sdpa"
GROUP_KWARG = "provmark_row_groups"
# Split only when the second group saves this share of the keys one call would read: an extra SDPA call
# per layer costs about as much as reading a few thousand keys (30 layers, tens of microseconds each).
MIN_SAVING = 0.2


@dataclass(frozen=True, slots=True)
class RowGroup:
    """Rows ``[start, stop)`` attend to their first ``kv_len`` keys; ``mask`` [n, 1, 1, kv_len] or None (all)."""

    start: int
    stop: int
    kv_len: int
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class RowLengths:
    """Row i's new token sits at ``positions[i]`` (int64 [B]) and attends to its first position + 1 keys,
    found through its block table ``tables[i]`` (int64 [B, W]) in the paged cache; for the native kernels."""

    positions: torch.Tensor
    tables: torch.Tensor

    @property
    def lengths(self) -> torch.Tensor:
        """Each row's key count (only the unfused attention path needs it, so it is not kept)."""
        return self.positions + 1


def plan_row_groups(positions: list[int], arange: torch.Tensor, pos_t: torch.Tensor) -> list[RowGroup]:
    """One group, or two contiguous ones when that reads at least MIN_SAVING fewer keys.

    ``positions[i]`` is row i's new token position; ``arange`` a preallocated ``arange(max_len)`` and
    ``pos_t`` the positions as a tensor (for the masks)."""
    rows = len(positions)
    longest = max(positions) + 1
    best_cut, best_read = rows, rows * longest
    # prefix maxima from the left and the right give every cut's cost in O(rows)
    left, right = [0] * rows, [0] * rows
    running = 0
    for i, p in enumerate(positions):
        running = max(running, p + 1)
        left[i] = running
    running = 0
    for i in range(rows - 1, -1, -1):
        running = max(running, positions[i] + 1)
        right[i] = running
    for cut in range(1, rows):
        read = cut * left[cut - 1] + (rows - cut) * right[cut]
        if read < best_read:
            best_cut, best_read = cut, read
    bounds = [(0, rows)] if best_read > (1 - MIN_SAVING) * rows * longest else [(0, best_cut), (best_cut, rows)]
    groups = []
    for start, stop in bounds:
        kv_len = max(positions[start:stop]) + 1
        part = positions[start:stop]
        mask = None
        if min(part) + 1 != kv_len:
            mask = (arange[:kv_len][None, :] <= pos_t[start:stop, None])[:, None, None, :]
        groups.append(RowGroup(start, stop, kv_len, mask))
    return groups


def slot_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs):
    """transformers attention-function signature; decode steps with row groups take the grouped path."""
    groups: list[RowGroup] | RowLengths | None = kwargs.pop(GROUP_KWARG, None)
    if groups is None or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if isinstance(groups, RowLengths):
        return paged_native.decode_attention(query, key, value, groups.tables, groups.lengths, scaling), None
    batch, heads, _, head_dim = query.shape
    kv_heads = key.shape[1]
    packed = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)  # heads h = kv * groups + j
    outputs = [
        F.scaled_dot_product_attention(packed[g.start:g.stop], key[g.start:g.stop, :, :g.kv_len],
                                       value[g.start:g.stop, :, :g.kv_len], attn_mask=g.mask, scale=scaling)
        for g in groups
    ]
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return out.reshape(batch, 1, heads, head_dim), None  # the [B, q, H, D] layout attention modules expect


def use_slot_attention_(view: torch.nn.Module) -> bool:
    """Point the view's config at the grouped attention (registered on first use); False if not SDPA-based."""
    config = view.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(ATTENTION_NAME, slot_sdpa_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    config._attn_implementation = ATTENTION_NAME
    return True
