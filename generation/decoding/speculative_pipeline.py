"""The engine sampler's processed distribution at any position of one request, drafted or committed.

Speculative verification needs, for each drafted position, the very distribution the engine would
sample from there: penalties, logit bias and bans (from that position's own history), then the
watermark bias (from that position's own last tokens), then temperature and truncation. This module
runs the engine's own stage functions (generation.sampling) over one row per position, each row with
a SamplerState replayed to that position, so the distribution is the engine's by construction.
"""

from __future__ import annotations

import torch

from generation.sampling import (
    SamplerState,
    _no_overflow_,
    SamplingParams,
    apply_bans_,
    apply_penalties_,
    truncate_,
)


def _needs_history(params: SamplingParams) -> bool:
    """Whether penalties or bans change with the tokens before a position (else one state serves all)."""
    return bool(params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
                or params.no_repeat_ngram_size or params.bad_words_ids or params.min_new_tokens)


class DistributionPipeline:
    """One request's committed tokens plus the stage functions; ``scores`` for rows past them.

    ``state`` is the request's SamplerState (its generator is the request's seeded stream);
    ``commit(token)`` appends an accepted token to it."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], eos_token_ids: set[int],
                 watermark=None) -> None:
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.eos_token_ids = set(eos_token_ids)
        self.watermark = watermark
        self.state = SamplerState(params, self.prompt_ids, self.eos_token_ids)
        self._per_position = _needs_history(params)

    @property
    def history(self) -> list[int]:
        """Prompt plus committed tokens (the state's own list: do not mutate)."""
        return self.state.history

    @property
    def generator(self) -> torch.Generator:
        return self.state.generator

    def commit(self, token: int) -> None:
        self.state.append(token)

    def _state_after(self, extension: list[int]) -> SamplerState:
        if not extension or not self._per_position:
            return self.state
        replayed = SamplerState(self.params, self.prompt_ids, self.eos_token_ids)
        for token in self.history[len(self.prompt_ids):] + list(extension):
            replayed.append(token)
        return replayed

    def penalised(self, logits: torch.Tensor, extensions: list[list[int]]) -> torch.Tensor:
        """Stage 1 over rows: row i is the position after the committed tokens + ``extensions[i]``."""
        scores = logits.to(torch.float32, copy=True)
        states = [self._state_after(ext) for ext in extensions]
        apply_penalties_(scores, states)
        apply_bans_(scores, states)
        return scores

    def finish_(self, scores: torch.Tensor, extensions: list[list[int]]) -> torch.Tensor:
        """Stages 3-4 in place on penalised rows: watermark bias, then (unless greedy) temperature and
        truncation. Greedy rows are ready for argmax; sampled rows for softmax."""
        wm = self.watermark
        if wm is not None:
            width = max(wm.context_width, 1)  # the bias only reads the last context_width tokens
            recent = self.history[max(0, len(self.history) - width):]
            tails = []
            for ext in extensions:
                full = recent + list(ext)
                tails.append(full[max(0, len(full) - width):])
            wm.bias(scores, tails)
        if self.params.greedy:
            return scores
        if self.params.temperature != 1.0:
            _no_overflow_(scores.div_(self.params.temperature))
        truncate_(scores, [self.params] * scores.shape[0])
        return scores

    def scores(self, logits: torch.Tensor, extensions: list[list[int]]) -> torch.Tensor:
        """Processed scores [R, V] of raw ``logits`` [R, V] (argmax for greedy, softmax otherwise)."""
        return self.finish_(self.penalised(logits, extensions), extensions)
