"""A causal LM with its own private KV cache that can be rolled back (transformers' DynamicCache + crop).

Speculative decoding runs the target over drafted tokens that may be rejected; their keys and values
are then cropped away. Contrastive decoding runs its expert and amateur on one each. The engine's slot
cache is never touched.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class CachedLM:
    """``logits(tokens, keep)`` runs only the tokens not yet cached; ``crop_to(n)`` forgets the rest."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.cached = 0  # tokens of the caller's sequence whose keys/values are in the cache
        self.forwards = 0

    @torch.inference_mode()
    def logits(self, tokens: list[int], keep: int) -> torch.Tensor:
        """Float32 logits [keep, V] of the last ``keep`` tokens of ``tokens``.

        ``tokens[:self.cached]`` must be the sequence the cache was filled with (the caller only ever
        extends it or crops it back); at least ``keep`` tokens must be new."""
        new = tokens[self.cached:]
        if len(new) < max(keep, 1):
            raise ValueError(f"CachedLM.logits: {len(new)} new tokens, {keep} logits asked")
        input_ids = torch.tensor([new], dtype=torch.long, device=self.device)
        positions = torch.arange(self.cached, len(tokens), device=self.device)[None]
        out = self.model(input_ids=input_ids, position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=keep)
        self.cached = len(tokens)
        self.forwards += 1
        return out.logits[0].float()

    def crop_to(self, length: int) -> None:
        """Keep the keys/values of the first ``length`` tokens only (no-op if fewer are cached)."""
        if length < self.cached:
            self.cache.crop(length - self.cached)  # transformers 5: a negative count removes tokens
            self.cached = length
