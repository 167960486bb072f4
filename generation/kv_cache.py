"""Paged KV cache: a pool of fixed-size blocks per attention layer, reached through per-sequence block tables.

Each attention layer owns two pools ``[num_blocks, kv_heads, block_size, head_dim]`` allocated once (an
anonymous mapping of zero pages, backed by memory only once written; ``lazy_zeros``). A sequence holds a list of block ids (its block table,
kept by generation/block_manager.py); position p of that sequence lives at row ``p % block_size`` of block
``table[p // block_size]``. Memory follows the tokens in use (whole blocks: at most ``block_size - 1`` rows
of waste per sequence), not ``max_model_len`` per sequence, and blocks can be shared between sequences
(prefix caching).

The HF model reaches the pools through transformers' ``Cache`` interface: every attention module calls
``past_key_values.update(k, v, layer_idx)``; our layers write the new keys/values where the current
``ForwardPlan`` says and hand back what attention must see:

- prefill (``q_len`` new tokens per row after ``start`` cached ones): the real tokens are written into the
  rows' blocks; with nothing cached before (``context_len == 0``) attention sees the fresh keys, else each
  row's keys gathered from its blocks, ``[B, kv_heads, context_len, head_dim]``.
- decode (one new token per row at its own position): written through the native writer (one call) or
  ``index_put_``; attention sees the pools themselves when the native kernels read them through the block
  tables (``plan.pooled``), else each row's keys gathered from its blocks, ``[B, kv_heads, kv_len, head_dim]``.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

DEFAULT_BLOCK_SIZE = 16
CACHE_MEMORY_SHARE = 0.25  # the default pool: at most this share of the memory available at start-up


@dataclass(slots=True)
class CacheConfig:
    """Shape of the pool: how many blocks of how many tokens, and how long a sequence may grow."""

    num_blocks: int
    max_model_len: int
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        for name in ("num_blocks", "max_model_len", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CacheConfig.{name}={value!r}: must be a positive int")
        if self.block_size & (self.block_size - 1):
            raise ValueError(f"CacheConfig.block_size={self.block_size}: must be a power of two")
        if self.max_model_len < 2:
            raise ValueError(f"CacheConfig.max_model_len={self.max_model_len}: must be >= 2")

    @classmethod
    def for_tokens(cls, tokens: int, max_model_len: int, block_size: int = DEFAULT_BLOCK_SIZE) -> CacheConfig:
        """A pool of at least ``tokens`` positions (whole blocks)."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"CacheConfig.block_size={block_size!r}: must be a positive int")
        return cls(-(-tokens // block_size), max_model_len, block_size)

    @property
    def blocks_per_seq(self) -> int:
        """Blocks one sequence of ``max_model_len`` tokens needs."""
        return -(-self.max_model_len // self.block_size)


@dataclass(slots=True)
class ForwardPlan:
    """Where the next forward pass writes into the cache and what attention reads (set by the runner)."""

    is_prefill: bool
    tables: torch.Tensor  # int64 [B, W]: each row's block ids
    kv_len: int  # keys attention sees (decode: max position + 1; prefill: context_len or q_len)
    write_blocks: torch.Tensor | None  # int64 [N]: the block of each written token (None: the native writer)
    write_offsets: torch.Tensor | None  # int64 [N]: its row within the block
    write_rows: torch.Tensor | None = None  # prefill: int64 [N], (row, token) of each written token
    write_cols: torch.Tensor | None = None
    context_len: int = 0  # prefill: > 0 when some row had cached tokens (attention gathers from blocks)
    positions: torch.Tensor | None = None  # decode: int64 [B], each row's new position
    pooled: bool = False  # decode: attention reads the pools through the tables (native kernels)


class PagedLayer(CacheLayerMixin):
    """One attention layer's key and value pools; ``update`` follows the shared plan."""

    is_sliding = False

    def __init__(self, owner: PagedKVCache, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys = keys
        self.values = values
        self.is_initialized = True
        self.dtype, self.device = keys.dtype, keys.device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the pools exist from the start."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        plan = self.owner.plan
        if plan is None:
            raise RuntimeError("PagedKVCache.update called without a ForwardPlan (use the engine's runner)")
        if plan.is_prefill:
            keys = key_states.transpose(1, 2)[plan.write_rows, plan.write_cols]  # [N, kv_heads, head_dim]
            values = value_states.transpose(1, 2)[plan.write_rows, plan.write_cols]
            self.keys[plan.write_blocks, :, plan.write_offsets] = keys
            self.values[plan.write_blocks, :, plan.write_offsets] = values
            if plan.context_len == 0:
                return key_states, value_states
            return self.gather(plan.tables, plan.context_len)
        writer = self.owner.position_writer
        if writer is not None:
            writer(self.keys, self.values, key_states, value_states, plan.tables, plan.positions)
        else:
            self.keys[plan.write_blocks, :, plan.write_offsets] = key_states[:, :, 0]
            self.values[plan.write_blocks, :, plan.write_offsets] = value_states[:, :, 0]
        if plan.pooled:
            return self.keys, self.values
        return self.gather(plan.tables, plan.kv_len)

    def gather(self, tables: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's first ``length`` keys and values, ``[B, kv_heads, length, head_dim]`` (a copy)."""
        block_size = self.keys.shape[2]
        used = tables[:, : -(-length // block_size)]
        rows, blocks = used.shape
        _, heads, _, dim = self.keys.shape
        keys = self.keys[used].transpose(1, 2).reshape(rows, heads, blocks * block_size, dim)[:, :, :length]
        values = self.values[used].transpose(1, 2).reshape(rows, heads, blocks * block_size, dim)[:, :, :length]
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self.owner.plan
        return (plan.kv_len if plan is not None else query_length), 0

    def get_seq_length(self) -> int:
        plan = self.owner.plan  # positions and the 4-D mask are passed: this only feeds cache_position
        return 0 if plan is None or plan.is_prefill else plan.kv_len - 1

    def get_max_length(self) -> int:
        return self.owner.config.max_model_len


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


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros whose memory is only backed once written, on the CPU: an anonymous mapping of fresh zero pages
    (``mmap``), where ``torch.zeros`` writes every byte (the whole pool resident at start-up). Plain 4 KiB pages:
    numpy's zeros would ask for transparent huge pages (``madvise``), and the kernel then finds each 2 MiB page
    by compacting memory when a block in it is first written, all 2 x layers pools at the same step (100 to
    250 ms stalls in the middle of decoding, benchmarks/engine_workloads.py's arrival workload)."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8).view(dtype).view(shape)


def kv_bytes_per_token(model_config, dtype: torch.dtype) -> int:
    """Raw key + value bytes one token occupies across all layers."""
    layers, kv_heads, head_dim = attention_shape(model_config, "the paged cache")
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def available_memory() -> int | None:
    """Bytes of memory available for new allocations without swapping: the kernel's MemAvailable (free memory
    plus the page cache it can reclaim), else the free pages; None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_cache_tokens(model: torch.nn.Module, max_num_seqs: int, max_model_len: int,
                         available: int | None = None) -> int:
    """Tokens the pool holds by default: every sequence at full length, capped by CACHE_MEMORY_SHARE of the
    memory ``available`` (default: ``available_memory()`` now), but never under one full sequence."""
    wanted = max_num_seqs * max_model_len
    available = available_memory() if available is None else available
    if available is None:
        return wanted
    per_token = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
    return max(max_model_len, min(wanted, int(available * CACHE_MEMORY_SHARE) // per_token))


class PagedKVCache(Cache):
    """transformers ``Cache`` over per-layer block pools (see module docstring)."""

    def __init__(self, config: CacheConfig, model_config, device: torch.device, dtype: torch.dtype) -> None:
        num_layers, kv_heads, head_dim = attention_shape(model_config, "the paged cache")
        self.config = config
        self.shape = (config.num_blocks, kv_heads, config.block_size, head_dim)
        self.plan: ForwardPlan | None = None
        # (keys, values, new_keys, new_values, tables, positions) -> None: decode writes each row at its own
        # position through it (paged_native.cache_write, handed over by the runner); None = index_put_
        self.position_writer = None
        layers = [PagedLayer(self, lazy_zeros(self.shape, dtype, device), lazy_zeros(self.shape, dtype, device))
                  for _ in range(num_layers)]
        super().__init__(layers=layers)

    @property
    def nbytes(self) -> int:
        """Memory reserved by all key and value pools (backed by pages only once written)."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    @torch.inference_mode()
    def copy_block(self, source: int, target: int) -> None:
        """Block ``target`` becomes a copy of block ``source`` in every layer, keys and values (copy on write)."""
        for layer in self.layers:
            layer.keys[target].copy_(layer.keys[source])
            layer.values[target].copy_(layer.values[source])

    @property
    def block_nbytes(self) -> int:
        """Memory of one block across all layers, keys and values."""
        return self.nbytes // self.config.num_blocks
