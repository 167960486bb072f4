"""Model runner: one forward pass of an HF causal LM over our paged KV cache, returning last-token logits.

The HF model computes positions and masks itself unless given them; we pass per-row ``position_ids`` and
a ready 4-D boolean mask (``[B, 1, q, kv]``, True = attend), which transformers' ``create_causal_mask``
returns unchanged. That is what makes ragged batches exact: each row sees only its own cached prefix.
Logits are computed only for the rows' last real token (the LM head over the whole prompt would cost
about a fifth of the prefill).

Decode attention: the native C++ kernels on the CPU where they build; elsewhere (CUDA) the block-table
attention in torch ops (generation/gpu/paged_attention.py), with decode batches replayed as CUDA graphs
(generation/gpu/graphs.py); else each row's keys gathered from its blocks and transformers' SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from generation.cpu import native, paged_native
from generation.cpu.direct_decode import DirectDecode
from generation.cpu.native_layers import use_native_layers_, use_native_linears_
from generation.cpu.packed_linear import packing_available
from generation.cpu.packed_view import packed_view
from generation.cpu.slot_attention import (
    GROUP_KWARG,
    RowLengths,
    plan_row_groups,
    use_slot_attention_,
)
from generation.gpu.graphs import DecodeGraphs
from generation.gpu.paged_attention import ROWS_KWARG, BlockTableRows, shared_view, use_block_table_attention_
from generation.kv_cache import CacheConfig, ForwardPlan, PagedKVCache


@dataclass(frozen=True, slots=True)
class ComputePaths:
    """Which compute paths a runner takes, each None = by the machine (see ``ModelRunner``): oneDNN-packed
    weights, the C++ kernels, decode attention through the block tables, CUDA graphs; and the opt-in int8
    weights (``int8_weights``, a float32 model on the C++ kernels)."""

    packed_weights: bool | None = None
    native_kernels: bool | None = None
    block_table_attention: bool | None = None
    cuda_graphs: bool | None = None
    int8_weights: bool = False


class ModelRunner:
    """Owns the KV cache and the scratch tensors; ``prefill`` / ``decode`` return logits ``[B, V]``."""

    def __init__(self, model: torch.nn.Module, cache_config: CacheConfig, packed_weights: bool | None = None,
                 native_kernels: bool | None = None, block_table_attention: bool | None = None,
                 cuda_graphs: bool | None = None, direct_decode: bool = True, int8_weights: bool = False) -> None:
        """``packed_weights``: run through a view of the model whose linear weights are pre-packed for
        oneDNN (generation/cpu/packed_linear.py); None = whenever this machine supports it.
        ``native_kernels``: in that view, decode attention, RMSNorm and the MLP's silu * up on the C++
        kernels (generation/cpu/native.py); None = whenever they build; True = ValueError if they cannot.
        ``block_table_attention``: decode attention through the block tables in torch ops
        (generation/gpu/paged_attention.py) instead of the native kernels; None = on CUDA.
        ``cuda_graphs``: decode batches through static buckets (generation/gpu/graphs.py), captured as CUDA
        graphs on CUDA and run eagerly elsewhere (for tests); None = on CUDA with the block-table attention.
        ``direct_decode``: decode steps that every linear's decode kernel takes run as a plain loop over the
        native view's layers (generation/cpu/direct_decode.py: the same kernels, the same bits, without
        transformers' module plumbing), wherever the view has that layout.
        ``int8_weights``: every linear of the view, the LM head included, on int8 weights with a float32 scale
        per output (generation/cpu/decode_linear.py), prefill and decode alike; a float32 model on the C++
        kernels only (ValueError otherwise). The loaded model keeps its float32 weights."""
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        if packed_weights is None:
            packed_weights = packing_available(model)
        self.packed_weights = bool(packed_weights)
        self.model = model
        forward_model = packed_view(model) if self.packed_weights else model
        if block_table_attention is None:
            block_table_attention = self.device.type == "cuda"
        if block_table_attention and native_kernels:
            raise ValueError("native_kernels and block_table_attention are two decode attentions: choose one")
        self.block_table_attention = False
        if block_table_attention:  # on the engine's own view (the loaded model keeps its attention)
            forward_model = forward_model if forward_model is not model else shared_view(model)
            self.block_table_attention = use_block_table_attention_(forward_model)
        # grouped decode attention (generation/cpu/slot_attention.py), only ever on our own view of the model
        self.slot_attention = (self.packed_weights and not self.block_table_attention
                               and use_slot_attention_(forward_model))
        # the C++ kernels (generation/cpu/native.py) where they build: decode attention (else SDPA over row
        # groups), the cache write, RMSNorm and silu * up (generation/cpu/native_layers.py)
        self.native_attention = (native_kernels is not False and self.slot_attention
                                 and native.available(self.dtype, self.device))
        if int8_weights and not (self.native_attention and self.dtype == torch.float32):
            raise ValueError("int8 weights need a float32 model on the CPU with the C++ kernels (a C++ compiler and "
                             f"AVX-512); this model is {self.dtype} on {self.device}")
        if native_kernels and not self.native_attention:
            raise ValueError(f"native kernels requested but unavailable for {self.dtype} on {self.device} "
                             "(they need packed weights on the CPU, float32/bfloat16 and a C++ compiler)")
        self.native_layers = use_native_layers_(forward_model) if self.native_attention else 0
        # decode batches' matmuls on the native kernel (it streams the weights faster than oneDNN)
        self.native_linears = use_native_linears_(forward_model, int8_weights) if self.native_attention else 0
        if int8_weights and not self.native_linears:
            raise ValueError("int8 weights: this build of the kernels has no AVX-512 linear")
        self.int8_weights = bool(int8_weights)
        self.view = forward_model  # the model the runner runs: the caller's, or its packed view
        self.decoder = forward_model.get_decoder()
        self.lm_head = forward_model.get_output_embeddings()
        if self.decoder is None or self.lm_head is None:
            raise ValueError(f"{type(model).__name__} has no decoder/LM head pair; not a causal LM we can drive")
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda" and self.block_table_attention
        if cuda_graphs and not self.block_table_attention:
            raise ValueError("cuda_graphs run the block-table attention: it is off or the model is not SDPA-based")
        if cuda_graphs:  # one more block than the block manager hands out: the padding rows' scratch block
            cache_config = CacheConfig(cache_config.num_blocks + 1, cache_config.max_model_len, cache_config.block_size)
        self.cache = PagedKVCache(cache_config, model.config, self.device, self.dtype)
        self.cache.position_writer = paged_native.cache_write if self.native_attention else None
        self.block_size = cache_config.block_size
        self.graphs = (DecodeGraphs(self, cache_config.num_blocks - 1, capture=self.device.type == "cuda")
                       if cuda_graphs else None)
        self.direct = (DirectDecode.of(self.decoder, self.cache)
                       if direct_decode and self.native_linears and self.graphs is None else None)
        # prompts prefilled as rows of their own tokens (``_prefill_flat``), no padding: where the decode attention
        # is the native kernels', which read each row's keys through the tables (as chunked prefills do)
        self.flat_prefill = self.native_attention
        # preallocated position vector, sliced per step instead of re-created
        self.positions = torch.arange(cache_config.max_model_len, device=self.device)

    def _tables(self, tables: list[list[int]], blocks: int) -> torch.Tensor:
        """Block tables as one int64 [B, blocks] tensor (rows padded with block 0, never read)."""
        return torch.tensor([t[:blocks] + [0] * (blocks - len(t[:blocks])) for t in tables], dtype=torch.long,
                            device=self.device)

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]], starts: list[int], tables: list[list[int]]) -> torch.Tensor:
        """Run each row's tokens ``prompts[b]`` at positions ``starts[b]..`` (the first ``starts[b]`` already
        cached in its blocks) into the blocks of ``tables[b]``; logits of each row's last token."""
        if self.flat_prefill:
            return self._prefill_flat(prompts, starts, tables)
        lengths = [len(p) for p in prompts]
        q_len, rows = max(lengths), len(prompts)
        input_ids = torch.zeros((rows, q_len), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        input_ids = input_ids.to(self.device)
        length_t = torch.tensor(lengths, device=self.device)
        start_t = torch.tensor(starts, device=self.device)
        ends = [s + n for s, n in zip(starts, lengths)]
        context = max(ends) if any(starts) else 0
        table_t = self._tables(tables, -(-max(ends) // self.block_size))
        pos = self.positions[:q_len]
        real = pos[None, :] < length_t[:, None]  # [B, q]
        write_rows, write_cols = real.nonzero(as_tuple=True)
        absolute = start_t[:, None] + pos[None, :]  # [B, q] each token's position in its sequence
        at = absolute[write_rows, write_cols]
        write_blocks = table_t[write_rows, at // self.block_size]
        if context:
            keys = self.positions[:context]
            # query t of row b sees its sequence's keys up to its own position (padded queries: the real ones)
            mask = ((keys[None, None, :] <= absolute[:, :, None])
                    & (keys[None, None, :] < (start_t + length_t)[:, None, None]))[:, None]
        elif self.block_table_attention and min(lengths) == q_len:
            mask = None  # plain causal rows: SDPA's is_causal (flash on CUDA, as model.generate's prefill)
        else:
            causal = pos[None, :, None] >= pos[None, None, :]  # [1, q, kv]
            real_key = pos[None, None, :] < length_t[:, None, None]  # [B, 1, kv]
            mask = (causal & real_key)[:, None]  # padded query rows still see their real prefix: no empty rows
        self.cache.plan = ForwardPlan(True, table_t, context or q_len, write_blocks, at % self.block_size,
                                      write_rows, write_cols, context_len=context)
        try:
            hidden = self.decoder(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=absolute,
                past_key_values=self.cache,
                use_cache=True,
            ).last_hidden_state
        finally:
            self.cache.plan = None
        return self.head(hidden[torch.arange(rows, device=self.device), length_t - 1])

    def _prefill_flat(self, prompts: list[list[int]], starts: list[int], tables: list[list[int]]) -> torch.Tensor:
        """``prefill`` without padding: each prompt token is one row at its own position, through the decode
        path's native attention (each row attends to its sequence's keys up to its own position, read through
        the block tables, after every row's key is written), so the linears compute exactly the prompts'
        tokens; logits of each prompt's last token."""
        tokens: list[int] = []
        positions: list[int] = []
        last: list[int] = []
        for prompt, start in zip(prompts, starts):
            tokens += prompt
            positions += range(start, start + len(prompt))
            last.append(len(tokens) - 1)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        # each sequence's table once, repeated for its rows (not a Python list per row: T x W ints for T tokens)
        table_t = self._tables(tables, -(-(max(positions) + 1) // self.block_size)).repeat_interleave(lengths, 0)
        return self.decode(ids, positions, table_t, last if len(last) < len(tokens) else None)

    @torch.inference_mode()
    def decode(self, token_ids: torch.Tensor, positions: list[int], tables: list[list[int]] | torch.Tensor,
               logit_rows: list[int] | None = None) -> torch.Tensor:
        """One token per row: ``token_ids[B]`` at ``positions[B]`` of the sequence whose blocks are
        ``tables[b]``; logits ``[B, V]`` (only of ``logit_rows``, in that order, when given). Rows may
        share a sequence (a prompt chunk): all rows' keys are written before any row attends. ``tables`` may
        also be the int64 [B, W] tensor ``_tables`` makes (W covering every row's position)."""
        if self.graphs is not None:
            logits = self.graphs.decode(token_ids, positions, tables, logit_rows)
            if logits is not None:
                return logits
        kv_len = max(positions) + 1
        ragged = min(positions) + 1 != kv_len
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)
        table_t = tables if isinstance(tables, torch.Tensor) else self._tables(tables, -(-kv_len // self.block_size))
        mask, extra = None, {}  # no mask: every row sees all kv_len keys (transformers then makes none either)
        if self.native_attention:  # each row's own key count, read exactly by the kernels through the tables
            extra[GROUP_KWARG] = RowLengths(pos, table_t)
        elif self.slot_attention:  # the row groups carry their own masks
            extra[GROUP_KWARG] = plan_row_groups(positions, self.positions, pos)
        elif ragged and not self.block_table_attention:  # (the block-table attention masks by row lengths)
            mask = (self.positions[:kv_len][None, :] <= pos[:, None])[:, None, None, :]
        hidden = self.decode_forward(token_ids, pos, table_t, kv_len, mask, extra, logits=False)
        if logit_rows is not None:
            hidden = hidden[torch.tensor(logit_rows, dtype=torch.long, device=self.device)]
        return self.head(hidden)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of ``hidden`` [B, D] through the LM head, as ordinary tensors (not inference tensors):
        the engine's sampler then works on them in place instead of copying [B, V] (generation/sample/pipeline.py)."""
        with torch.inference_mode(False), torch.no_grad():
            return self.lm_head(hidden).float()

    def decode_forward(self, token_ids: torch.Tensor, pos: torch.Tensor, table_t: torch.Tensor, kv_len: int,
                       mask: torch.Tensor | None = None, extra: dict | None = None, logits: bool = True) -> torch.Tensor:
        """The decode step's forward over tensors only (no host sync: CUDA graphs capture it): ``token_ids``
        [B], ``pos`` [B], block tables ``table_t`` [B, W]; float32 logits [B, V] (hidden states if not ``logits``)."""
        if self.direct is not None and mask is None and self.direct.takes(token_ids.shape[0], self.dtype):
            hidden = self.direct(token_ids, pos, table_t)  # the module forward's bits, without its plumbing
            return self.lm_head(hidden).float() if logits else hidden
        extra = dict(extra or {})
        if self.block_table_attention:
            extra[ROWS_KWARG] = BlockTableRows(table_t, pos + 1)
        if self.cache.position_writer is None:  # index_put_ writes: each row's block and row within it
            rows = torch.arange(token_ids.shape[0], device=self.device)
            blocks, offsets = table_t[rows, pos // self.block_size], pos % self.block_size
        else:
            blocks = offsets = None
        self.cache.plan = ForwardPlan(False, table_t, kv_len, blocks, offsets, positions=pos,
                                      pooled=self.native_attention or self.block_table_attention)
        try:
            hidden = self.decoder(
                input_ids=token_ids[:, None],
                attention_mask=mask,
                position_ids=pos[:, None],
                past_key_values=self.cache,
                use_cache=True,
                **extra,
            ).last_hidden_state
        finally:
            self.cache.plan = None
        return self.lm_head(hidden[:, 0]).float() if logits else hidden[:, 0]
