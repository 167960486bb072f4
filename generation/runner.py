"""Model runner: one forward pass of an HF causal LM over our slot KV cache, returning last-token logits.

The HF model computes positions and masks itself unless given them; we pass per-row ``position_ids`` and
a ready 4-D boolean mask (``[B, 1, q, kv]``, True = attend), which transformers' ``create_causal_mask``
returns unchanged. That is what makes ragged batches exact: each row sees only its own cached prefix.
Logits are computed only for the rows' last real token (the LM head over the whole prompt would cost
about a fifth of the prefill).
"""

from __future__ import annotations

import torch

from generation.cpu import native
from generation.cpu.native_layers import use_native_layers_, use_native_linears_
from generation.cpu.packed_linear import packing_available
from generation.cpu.packed_view import packed_view
from generation.cpu.slot_attention import (
    GROUP_KWARG,
    RowLengths,
    plan_row_groups,
    use_slot_attention_,
)
from generation.kv_cache import CacheConfig, ForwardPlan, SlotKVCache


class ModelRunner:
    """Owns the KV cache and the scratch tensors; ``prefill`` / ``decode`` return logits ``[B, V]``."""

    def __init__(self, model: torch.nn.Module, cache_config: CacheConfig, packed_weights: bool | None = None,
                 native_kernels: bool | None = None) -> None:
        """``packed_weights``: run through a view of the model whose linear weights are pre-packed for
        oneDNN (generation/cpu/packed_linear.py); None = whenever this machine supports it.
        ``native_kernels``: in that view, decode attention, RMSNorm and the MLP's silu * up on the C++
        kernels (generation/cpu/native.py); None = whenever they build; True = ValueError if they cannot."""
        if packed_weights is None:
            packed_weights = packing_available(model)
        self.packed_weights = bool(packed_weights)
        self.model = model
        forward_model = packed_view(model) if self.packed_weights else model
        # grouped decode attention (generation/cpu/slot_attention.py), only ever on our own view of the model
        self.slot_attention = self.packed_weights and use_slot_attention_(forward_model)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # the C++ kernels (generation/cpu/native.py) where they build: decode attention (else SDPA over row
        # groups), the cache write, RMSNorm and silu * up (generation/cpu/native_layers.py)
        self.native_attention = (native_kernels is not False and self.slot_attention
                                 and native.available(self.dtype, self.device))
        if native_kernels and not self.native_attention:
            raise ValueError(f"native kernels requested but unavailable for {self.dtype} on {self.device} "
                             "(they need packed weights on the CPU, float32/bfloat16 and a C++ compiler)")
        self.native_layers = use_native_layers_(forward_model) if self.native_attention else 0
        # decode batches' matmuls on the native kernel (it streams the weights faster than oneDNN)
        self.native_linears = use_native_linears_(forward_model) if self.native_attention else 0
        self.decoder = forward_model.get_decoder()
        self.lm_head = forward_model.get_output_embeddings()
        if self.decoder is None or self.lm_head is None:
            raise ValueError(f"{type(model).__name__} has no decoder/LM head pair; not a causal LM we can drive")
        self.cache = SlotKVCache(cache_config, model.config, self.device, self.dtype)
        self.cache.position_writer = native.cache_write if self.native_attention else None
        max_len = cache_config.max_model_len
        # preallocated position vector, sliced per step instead of re-created
        self.positions = torch.arange(max_len, device=self.device)

    @torch.inference_mode()
    def prefill(self, row_start: int, prompts: list[list[int]]) -> torch.Tensor:
        """Run prompts (new or recomputed sequences) into slots ``row_start..``; logits of each last token."""
        lengths = [len(p) for p in prompts]
        q_len = max(lengths)
        input_ids = torch.zeros((len(prompts), q_len), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        input_ids = input_ids.to(self.device)
        length_t = torch.tensor(lengths, device=self.device)
        pos = self.positions[:q_len]
        causal = pos[None, :, None] >= pos[None, None, :]  # [1, q, kv]
        real_key = pos[None, None, :] < length_t[:, None, None]  # [B, 1, kv]
        mask = (causal & real_key)[:, None]  # padded query rows still see their real prefix: no empty rows
        self.cache.plan = ForwardPlan(True, row_start, len(prompts), q_len, q_len)
        try:
            hidden = self.decoder(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=pos[None, :].expand(len(prompts), -1),
                past_key_values=self.cache,
                use_cache=True,
            ).last_hidden_state
        finally:
            self.cache.plan = None
        last = hidden[torch.arange(len(prompts), device=self.device), length_t - 1]
        return self.lm_head(last).float()

    @torch.inference_mode()
    def decode(self, token_ids: torch.Tensor, positions: torch.Tensor, kv_len: int, ragged: bool = True) -> torch.Tensor:
        """One token per slot ``0..B-1``: ``token_ids[B]`` at ``positions[B]``; logits ``[B, V]``.

        ``ragged=False`` promises every position equals ``kv_len - 1`` (then no mask is built)."""
        batch = token_ids.shape[0]
        mask, extra = None, {}  # no mask: every row sees all kv_len keys (transformers then makes none either)
        if self.native_attention:  # each row's own key count, read exactly by the kernels
            positions = positions.to(torch.int64).contiguous()
            extra[GROUP_KWARG] = RowLengths(positions)
        elif self.slot_attention:  # the row groups carry their own masks
            extra[GROUP_KWARG] = plan_row_groups(positions.tolist(), self.positions, positions)
        elif ragged:
            mask = (self.positions[:kv_len][None, :] <= positions[:, None])[:, None, None, :]
        if self.cache.position_writer is not None:
            plan = ForwardPlan(False, 0, batch, 1, kv_len, positions=positions)
        else:
            plan = ForwardPlan(False, 0, batch, 1, kv_len, self.cache.decode_index(positions))
        self.cache.plan = plan
        try:
            hidden = self.decoder(
                input_ids=token_ids[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                past_key_values=self.cache,
                use_cache=True,
                **extra,
            ).last_hidden_state
        finally:
            self.cache.plan = None
        return self.lm_head(hidden[:, 0]).float()
