"""One speculative request's committed tokens, and the LogitsPipeline rows of positions past them.

Verification needs, at each drafted position, the very distribution the engine would sample from
there. The engine's LogitsPipeline computes it; this module only says what each position's row is: a
SamplerState replayed to that position (penalties and bans read its history) and the watermark
context of the committed plus drafted tokens.
"""

from __future__ import annotations

import torch

from generation.sample import LogitsPipeline, StepRows
from generation.sample.sampler import SamplerState, SamplingParams
from generation.sample.sampling_stage import is_sampling_mark
from watermark.scheme import Watermark


def _needs_history(params: SamplingParams) -> bool:
    """Whether penalties or bans change with the tokens before a position (else one state serves all)."""
    return bool(params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty
                or params.no_repeat_ngram_size or params.bad_words_ids or params.min_new_tokens)


class RequestPositions:
    """``state`` is the request's SamplerState (its generator is the request's seeded stream);
    ``commit(token)`` appends an accepted token to it. ``distributions`` runs the pipeline for rows past it."""

    def __init__(self, pipeline: LogitsPipeline, params: SamplingParams, prompt_ids: list[int],
                 eos_token_ids: set[int], watermark: Watermark | None = None) -> None:
        self.pipeline = pipeline
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

    def rows(self, extensions: list[list[int]]) -> StepRows:
        """Row i: the position after the committed tokens + ``extensions[i]``."""
        states = [self._state_after(ext) for ext in extensions]
        marks = [self.watermark] * len(extensions)
        histories = None
        if self.replays:  # a sampling watermark's dedup reads the whole committed history
            histories = [self.history + list(ext) for ext in extensions]
        elif self.watermark is not None:
            width = max(self.watermark.context_width, 1)  # the watermark only reads the last context_width tokens
            recent = self.history[max(0, len(self.history) - width):]
            histories = [recent + list(ext) for ext in extensions]
        return StepRows.of(states, marks, histories=histories)

    @property
    def replays(self) -> bool:
        """True when drafts are verified by replaying the target's choice (a sampled request under a
        sampling watermark: gumbel, synthid)."""
        return not self.params.greedy and is_sampling_mark(self.watermark)

    def choice(self, probs: torch.Tensor, rows: StepRows, row: int, generator: torch.Generator) -> int:
        """The pipeline's token for row ``row`` of ``rows`` from its probabilities [V] (stage 8 alone)."""
        return self.pipeline.staged_choice(probs, rows, row, generator)

    def penalised(self, logits: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Pipeline stages 1-4 on a copy of ``logits`` [R, V] (what logprobs are reported from)."""
        return self.pipeline.penalise(logits, rows)

    def distributions(self, scores: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """The rest of the pipeline, in place on penalised rows: greedy requests get watermarked scores
        (for argmax), sampled ones the probabilities the pipeline draws from."""
        self.pipeline.watermark_(scores, rows)
        return scores if self.params.greedy else self.pipeline.probabilities(scores, rows)

    def distribution_of(self, logits: torch.Tensor, extensions: list[list[int]]) -> torch.Tensor:
        """``distributions`` of raw ``logits`` [R, V]."""
        rows = self.rows(extensions)
        return self.distributions(self.penalised(logits, rows), rows)
