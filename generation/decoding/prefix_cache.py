"""A KV cache whose branches (beams, best_of siblings) share one copy of the prompt's keys/values.

Each attention layer stores the prompt's keys/values once, ``[1, kv_heads, P, head_dim]``, and the
branches' generated keys/values in preallocated buffers ``[max_branches, kv_heads, max_new, head_dim]``
written in place. Attention of branch b sees ``prompt (broadcast by expand: a view, never a stored copy)
++ generated[b, :, :t]``. ``reorder(index)`` (beam selection, dropping finished siblings) moves only the
generated part, so forking a beam never copies the prompt.

``PrefixRunner`` drives the HF decoder over it: ``prefill()`` runs the prompt once at batch 1, then
``step(tokens[branches])`` feeds one token per branch and returns ``logits[branches, V]``.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from generation.kv_cache import attention_shape


class PrefixLayer(CacheLayerMixin):
    """One attention layer: the shared prompt keys/values plus per-branch generated buffers."""

    is_sliding = False

    def __init__(self, owner: PrefixSharedCache, shape: tuple[int, int, int, int], dtype, device) -> None:
        super().__init__()
        self.owner = owner
        self.prompt_keys: torch.Tensor | None = None  # [1, H, P, D], set by the prefill
        self.prompt_values: torch.Tensor | None = None
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # generated part [branches, H, max_new, D]
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.is_initialized = True
        self.dtype, self.device = dtype, device

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist from the start."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        owner = self.owner
        if owner.prompt_len == 0:  # the prefill: these are the prompt's keys, kept once
            if key_states.shape[0] != 1:
                raise ValueError(f"prefix cache: the prompt is prefilled at batch 1, got batch {key_states.shape[0]}")
            self.prompt_keys = key_states.contiguous()
            self.prompt_values = value_states.contiguous()
            return key_states, value_states
        branches, _, q_len, _ = key_states.shape
        if branches != owner.branches:
            raise ValueError(f"prefix cache: {branches} rows fed but {owner.branches} branches are live")
        start = owner.generated
        self.keys[:branches, :, start:start + q_len].copy_(key_states)
        self.values[:branches, :, start:start + q_len].copy_(value_states)
        end = start + q_len
        shared = (branches, -1, -1, -1)
        keys = torch.cat((self.prompt_keys.expand(shared), self.keys[:branches, :, :end]), dim=2)
        values = torch.cat((self.prompt_values.expand(shared), self.values[:branches, :, :end]), dim=2)
        return keys, values

    def reorder(self, index: torch.Tensor, length: int) -> None:
        """Generated rows ``index`` become rows ``0..len(index)-1`` (first ``length`` positions)."""
        count = index.shape[0]
        self.keys[:count, :, :length] = self.keys[:, :, :length].index_select(0, index)
        self.values[:count, :, :length] = self.values[:, :, :length].index_select(0, index)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.prompt_len + self.owner.generated + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.prompt_len + self.owner.generated

    def get_max_length(self) -> int:
        return self.owner.prompt_len + self.keys.shape[2]


class PrefixSharedCache(Cache):
    """transformers ``Cache``: one shared prompt, up to ``max_branches`` branches of ``max_new`` tokens."""

    def __init__(self, model_config, max_branches: int, max_new: int, device, dtype) -> None:
        if not isinstance(max_branches, int) or max_branches < 1:
            raise ValueError(f"max_branches={max_branches!r}: must be an int >= 1")
        if not isinstance(max_new, int) or max_new < 1:
            raise ValueError(f"max_new={max_new!r}: must be an int >= 1")
        num_layers, kv_heads, head_dim = attention_shape(model_config, "the prefix cache")
        shape = (max_branches, kv_heads, max_new, head_dim)
        self.max_branches, self.max_new = max_branches, max_new
        self.prompt_len = 0  # 0 until the prefill: update() then stores the prompt
        self.generated = 0  # generated positions every live branch holds
        self.branches = max_branches
        super().__init__(layers=[PrefixLayer(self, shape, dtype, device) for _ in range(num_layers)])

    def reorder(self, index: torch.Tensor | list[int]) -> None:
        """Keep branches ``index`` (in that order, repeats allowed): beam selection or dropping siblings.

        Only the generated keys/values move; the prompt's stay where they are."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.layers[0].keys.device)
        if index.dim() != 1 or not 1 <= index.shape[0] <= self.max_branches:
            raise ValueError(f"reorder: index must list 1..{self.max_branches} branches, got shape {tuple(index.shape)}")
        if bool((index < 0).any()) or bool((index >= self.branches).any()):
            raise ValueError(f"reorder: branch ids must lie in [0, {self.branches})")
        for layer in self.layers:
            layer.reorder(index, self.generated)
        self.branches = int(index.shape[0])

    @property
    def prompt_nbytes(self) -> int:
        """Memory held by the one stored copy of the prompt's keys/values."""
        return sum(layer.prompt_keys.nbytes + layer.prompt_values.nbytes for layer in self.layers
                   if layer.prompt_keys is not None)


class PrefixRunner:
    """Prefill a prompt once, then step ``branches`` continuations of it in one batch.

    ``forward(input_ids, position_ids, cache, attention_mask)`` returns float32 logits [B, V] of the
    last position: an engine's ``forward`` (its own decoder and LM head) or, by default, the model's."""

    def __init__(self, model: torch.nn.Module, prompt_ids: list[int], branches: int, max_new: int,
                 forward=None) -> None:
        if not prompt_ids:
            raise ValueError("prompt: empty (no tokens)")
        param = next(model.parameters())
        self.device = param.device
        self.prompt_ids = list(prompt_ids)
        self.cache = PrefixSharedCache(model.config, branches, max_new, self.device, param.dtype)
        self.forward = forward if forward is not None else _model_forward(model)

    @classmethod
    def for_engine(cls, engine, prompt_ids: list[int], branches: int, max_new: int) -> PrefixRunner:
        """A runner over the engine's model through the engine's own forward (same numerics)."""
        return cls(engine.model, prompt_ids, branches, max_new, forward=engine.forward)

    @property
    def branches(self) -> int:
        return self.cache.branches

    @property
    def generated(self) -> int:
        """Tokens each branch has fed so far (its next position is prompt length + this)."""
        return self.cache.generated

    @torch.inference_mode()
    def prefill(self) -> torch.Tensor:
        """Run the prompt at batch 1; logits ``[1, V]`` of its last token. Call once, first."""
        if self.cache.prompt_len:
            raise RuntimeError("prefill: the prompt is already cached")
        length = len(self.prompt_ids)
        input_ids = torch.tensor([self.prompt_ids], dtype=torch.long, device=self.device)
        pos = torch.arange(length, device=self.device)
        causal = (pos[:, None] >= pos[None, :])[None, None]  # [1, 1, P, P], True = attend (as the engine's runner)
        logits = self.forward(input_ids, pos[None, :], self.cache, causal)
        self.cache.prompt_len = length
        return logits

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """Feed one token per live branch; logits ``[branches, V]`` for each branch's next token."""
        if not self.cache.prompt_len:
            raise RuntimeError("step: call prefill() first")
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        if tokens.shape != (self.cache.branches,):
            raise ValueError(f"step: expected {self.cache.branches} tokens (one per branch), got shape {tuple(tokens.shape)}")
        if self.cache.generated >= self.cache.max_new:
            raise RuntimeError(f"step: the cache holds {self.cache.max_new} generated tokens per branch; all used")
        position = self.cache.prompt_len + self.cache.generated
        positions = torch.full((tokens.shape[0], 1), position, dtype=torch.long, device=self.device)
        # one query that sees every cached key: no mask needed (as the engine's non-ragged decode)
        logits = self.forward(tokens[:, None], positions, self.cache, None)
        self.cache.generated += 1
        return logits

    def reorder(self, index: torch.Tensor | list[int]) -> None:
        """Branches ``index`` continue (see PrefixSharedCache.reorder)."""
        self.cache.reorder(index)


def _model_forward(model: torch.nn.Module):
    """A causal LM's decoder and LM head as a forward: float32 logits [B, V] of the last position."""
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    if decoder is None or lm_head is None:
        raise ValueError(f"{type(model).__name__} has no decoder/LM head pair; not a causal LM we can drive")

    def forward(input_ids, position_ids, cache, attention_mask=None) -> torch.Tensor:
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache, use_cache=True).last_hidden_state
        return lm_head(hidden[:, -1]).float()

    return forward
