"""KV cache preallocated on the model's device, one fixed slot of ``max_model_len`` tokens per sequence.

Each attention layer owns two buffers ``[num_slots, kv_heads, max_model_len, head_dim]`` allocated once
and written in place (gpt-fast style). The engine keeps running sequences in the slots ``0..n-1``
(compacted when one leaves), so a decode step reads ``keys[:n, :, :kv_len]`` as a view: no gather,
no copy. The HF model reaches the buffers through transformers' ``Cache`` interface: every attention
module calls ``past_key_values.update(k, v, layer_idx)``; our layers write the new keys/values where the
current ``ForwardPlan`` says and hand back what attention must see.

Two plan shapes:
- prefill: rows ``[row_start, row_start + B)`` get their first ``q_len`` positions written from the fresh
  keys; nothing is cached before (new or recomputed sequences), so attention sees the fresh keys.
- decode: one new token per row ``0..B-1`` at that row's own position; attention sees ``[:B, :, :kv_len]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass(slots=True)
class CacheConfig:
    """Shape of the preallocated cache: how many sequences at once and how long each may grow."""

    num_slots: int
    max_model_len: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_slots, int) or self.num_slots < 1:
            raise ValueError(f"num_slots must be a positive int, got {self.num_slots!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 2:
            raise ValueError(f"max_model_len must be an int >= 2, got {self.max_model_len!r}")


@dataclass(slots=True)
class ForwardPlan:
    """Where the next forward pass writes into the cache (set by the runner before each forward)."""

    is_prefill: bool
    row_start: int  # first slot of the batch (rows are contiguous slots)
    num_rows: int
    q_len: int  # prefill: padded prompt length; decode: 1
    kv_len: int  # decode: keys attention must see (max position + 1 over the batch)
    flat_index: torch.Tensor | None = None  # decode: LongTensor[B * kv_heads], see SlotKVCache.decode_index
    positions: torch.Tensor | None = None  # decode: LongTensor[B], each row's new position (native write)


class SlotLayer(CacheLayerMixin):
    """One attention layer's preallocated keys/values; ``update`` follows the shared plan."""

    is_sliding = False

    def __init__(self, owner: SlotKVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys = keys
        self.values = values
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist from the start."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("SlotKVCache.update called without a ForwardPlan (use the engine's runner)")
        rows = slice(plan.row_start, plan.row_start + plan.num_rows)
        if plan.is_prefill:
            self.keys[rows, :, : plan.q_len].copy_(key_states)
            self.values[rows, :, : plan.q_len].copy_(value_states)
            return key_states, value_states
        # decode: each (row, head) writes its one new key at that row's own position: one call of the
        # writer the runner handed over (generation/cpu/native.py's cache_write), else index_copy_ on a flat
        # [slots * heads * positions, head_dim] view (far cheaper than advanced-index assignment)
        if self.owner.position_writer is not None and plan.positions is not None:
            self.owner.position_writer(self.keys, self.values, key_states, value_states, plan.positions)
        else:
            head_dim = key_states.shape[-1]
            self.keys.view(-1, head_dim).index_copy_(0, plan.flat_index, key_states.reshape(-1, head_dim))
            self.values.view(-1, head_dim).index_copy_(0, plan.flat_index, value_states.reshape(-1, head_dim))
        return self.keys[rows, :, : plan.kv_len], self.values[rows, :, : plan.kv_len]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (plan.kv_len if plan is not None else query_length), 0

    def get_seq_length(self) -> int:
        plan = self.owner.plan
        return 0 if plan is None or plan.is_prefill else plan.kv_len - 1

    def get_max_length(self) -> int:
        return self.keys.shape[2]


def attention_shape(model_config, user: str) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a full-attention decoder; ValueError naming ``user`` otherwise."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        raise ValueError(f"model has non-full-attention layers {sorted(set(layer_types))}: not supported")
    if getattr(text_config, "sliding_window", None) is not None:
        raise ValueError(f"models with a sliding attention window are not supported by {user}")
    kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return text_config.num_hidden_layers, kv_heads, head_dim


class SlotKVCache(Cache):
    """transformers ``Cache`` over preallocated per-slot buffers (see module docstring)."""

    def __init__(self, config: CacheConfig, model_config, device: torch.device, dtype: torch.dtype) -> None:
        num_layers, kv_heads, head_dim = attention_shape(model_config, "the slot cache")
        self.config = config
        self.shape = (config.num_slots, kv_heads, config.max_model_len, head_dim)
        self.plan: ForwardPlan | None = None
        # (keys, values, new_keys, new_values, positions) -> None: decode writes each row at its own position
        # through it (native.cache_write, handed over by the runner); None = index_copy_
        self.position_writer = None
        layers = [
            SlotLayer(self, torch.zeros(self.shape, dtype=dtype, device=device), torch.zeros(self.shape, dtype=dtype, device=device))
            for _ in range(num_layers)
        ]
        super().__init__(layers=layers)

    def decode_index(self, positions: torch.Tensor) -> torch.Tensor:
        """Flat row numbers of (slot i, head h, positions[i]) for slots 0..B-1, row-major like update's input."""
        _, heads, max_len, _ = self.shape
        slots = torch.arange(positions.shape[0], device=positions.device)[:, None]
        head_ids = torch.arange(heads, device=positions.device)[None, :]
        return ((slots * heads + head_ids) * max_len + positions[:, None]).reshape(-1)

    @property
    def nbytes(self) -> int:
        """Memory held by all key and value buffers."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` cached positions of slot ``src`` into slot ``dst`` (compaction)."""
        for layer in self.layers:
            layer.keys[dst, :, :length].copy_(layer.keys[src, :, :length])
            layer.values[dst, :, :length].copy_(layer.values[src, :, :length])
