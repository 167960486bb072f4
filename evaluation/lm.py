"""Teacher-forced passes of the evaluation's language model: per-token log-likelihoods (perplexity)
and next-token logits at chosen positions (the model-proposed substitutions).

Separate from the engine on purpose: scoring a given text needs one forward pass over all of its
tokens at once, not sampling; the same loaded weights serve both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

DEFAULT_BATCH_TOKENS = 4096  # padded tokens per forward pass: bounds the [B, T, V] logits (~800 MB fp32)


class TeacherForcedLM:
    """``TeacherForcedLM(loaded)`` over a ``generation.models.LoadedModel`` (or any HF causal LM + tokenizer)."""

    def __init__(self, loaded, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        if not isinstance(batch_tokens, int) or batch_tokens < 1:
            raise ValueError(f"batch_tokens: expected a positive integer, got {batch_tokens!r}")
        self.model = loaded.model
        self.tokenizer = loaded.vocab.tokenizer
        self.device = next(self.model.parameters()).device
        self.batch_tokens = batch_tokens
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_len = int(limit) if limit else 2048

    def __repr__(self) -> str:
        return f"TeacherForcedLM({type(self.model).__name__}, batch_tokens={self.batch_tokens})"

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def token_logprobs(self, sequences: Sequence[Sequence[int]], starts: Sequence[int]) -> list[np.ndarray]:
        """For each sequence, log p(token_i | tokens before i) for i in [start, len): float64 arrays.

        ``start`` must be >= 1 (the first token has no context). Sequences longer than the model's
        positions keep their last ``max_len`` tokens."""
        out: list[np.ndarray | None] = [None] * len(sequences)

        def collect(index: int, ids: torch.Tensor, logits: torch.Tensor, offset: int) -> None:
            start = max(1, starts[index] - offset)
            logp = torch.log_softmax(logits[start - 1: ids.shape[0] - 1].double(), dim=-1)
            out[index] = logp.gather(1, ids[start:, None]).squeeze(1).cpu().numpy()

        self._forward_each(sequences, collect)
        return [x if x is not None else np.zeros(0) for x in out]

    def next_token_logits(self, sequences: Sequence[Sequence[int]],
                          positions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """For each sequence, the logits [len(positions), V] of the token AT each position given the
        tokens before it (position 0 is not allowed: it has no context)."""
        out: list[torch.Tensor | None] = [None] * len(sequences)

        def collect(index: int, ids: torch.Tensor, logits: torch.Tensor, offset: int) -> None:
            wanted = torch.as_tensor(list(positions[index]), dtype=torch.long) - offset
            if wanted.numel() and int(wanted.min()) < 1:
                raise ValueError("positions: every position needs at least one token before it")
            out[index] = logits[wanted - 1].float().cpu()

        self._forward_each(sequences, collect)
        return [x if x is not None else torch.zeros(0) for x in out]

    @torch.inference_mode()
    def _forward_each(self, sequences: Sequence[Sequence[int]],
                      collect: Callable[[int, torch.Tensor, torch.Tensor, int], None]) -> None:
        """Right-padded batches of similar length; ``collect(index, ids, logits[len, V], offset)``."""
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
        batch: list[int] = []
        for index in order + [None]:
            if index is not None:
                longest = min(self.max_len, max(len(sequences[i]) for i in batch + [index]))
                if not batch or longest * (len(batch) + 1) <= self.batch_tokens:
                    batch.append(index)
                    continue
            if batch:
                self._run_batch(sequences, batch, collect)
            batch = [index] if index is not None else []

    def _run_batch(self, sequences, batch: list[int], collect) -> None:
        rows = []
        for i in batch:
            ids = list(sequences[i])
            offset = max(0, len(ids) - self.max_len)
            rows.append((i, torch.tensor(ids[offset:], dtype=torch.long), offset))
        width = max(r[1].shape[0] for r in rows)
        input_ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (_, ids, _) in enumerate(rows):
            input_ids[row, : ids.shape[0]] = ids
            mask[row, : ids.shape[0]] = 1
        logits = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device)).logits
        for row, (i, ids, offset) in enumerate(rows):
            collect(i, ids.to(logits.device), logits[row, : ids.shape[0]], offset)
