"""The rows of one sampling step (``StepRows``: each row's sampler state, watermark, context and the step's
constraint masks) and a subset of them (``RowSubset``), as ``generation.sample.pipeline.LogitsPipeline`` reads
them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from generation.constraints.masks import ConstraintMasks
from generation.sample.params import SamplerState
from generation.sample.sampling_stage import check_request, is_sampling_mark, row_context
from watermark.scheme import Watermark

NEG_INF = float("-inf")


@dataclass(slots=True)
class StepRows:
    """What one step knows about its rows: each row's sampler state (parameters, history, generator),
    watermark and context, and the step's constraint masks. Build with ``StepRows.of``."""

    states: list[SamplerState]
    watermarks: list[Watermark | None]
    contexts: list[list[int]]  # a watermarked row's last context_width tokens (at least 1); [] elsewhere
    constraint: ConstraintMasks | None = None
    # rows whose sampling watermark sits this position out (short or repeated context): the plain draw;
    # None when no row has a sampling watermark
    unmarked: list[bool] | None = None
    allowed_counts: list[int | None] | None = None  # from the constraint mask, per row
    _masked: torch.Tensor | None = field(default=None, repr=False)  # constrained rows after stage 1

    @classmethod
    def of(cls, states: Sequence[SamplerState], watermarks: Sequence[Watermark | None] | None = None,
           constraint: ConstraintMasks | None = None,
           histories: Sequence[Sequence[int]] | None = None) -> StepRows:
        """Rows for one step. ``histories`` overrides the token history a row's watermark context is
        read from (a drafted position past its state's history); by default the state's own."""
        states = list(states)
        marks = list(watermarks) if watermarks is not None else [None] * len(states)
        if len(marks) != len(states) or (histories is not None and len(histories) != len(states)):
            raise ValueError(f"StepRows: {len(states)} states, {len(marks)} watermarks"
                             + (f", {len(histories)} histories" if histories is not None else ""))
        contexts: list[list[int]] = []
        unmarked: list[bool] | None = None
        for i, mark in enumerate(marks):
            if mark is None:
                contexts.append([])
                continue
            history = histories[i] if histories is not None else states[i].history
            if is_sampling_mark(mark):  # the sampler is the watermark: greedy fails closed here too
                check_request(mark, states[i].params)
                context, marked = row_context(mark, states[i], history)
                contexts.append(context)
                unmarked = unmarked if unmarked is not None else [False] * len(marks)
                unmarked[i] = not marked
                continue
            width = max(mark.context_width, 1)  # the stage only reads the last context_width tokens
            contexts.append(list(history[max(0, len(history) - width):]))
        return cls(states, marks, contexts, constraint, unmarked=unmarked)

    @property
    def params(self):
        return [st.params for st in self.states]

    def apply_constraint_(self, scores: torch.Tensor) -> None:
        """Stage 1 in place: -inf outside each constrained row's allowed set. Keeps those rows' masked scores:
        what a row that stages 2-5 strip bare falls back to (``restore_constrained_``)."""
        if self.constraint is None:
            return
        self.allowed_counts = self.constraint.apply_(scores)
        if self.constraint.rows:
            index = torch.tensor(self.constraint.rows, dtype=torch.long, device=scores.device)
            self._masked = scores.index_select(0, index)

    def restore_constrained_(self, scores: torch.Tensor) -> None:
        """Constrained rows that stages 2-5 left without a finite logit get their stage-1 scores back: the
        constraint wins."""
        if self.constraint is not None and self.constraint.rows:
            restore_dead_rows_(scores, self.constraint.rows, self._masked)


@dataclass(slots=True)
class RowSubset:
    """Some of a step's rows, in batch order. Two index spaces meet here: a *batch* index counts the step's rows
    (the rows of its scores and of its StepRows); a *local* index j counts this subset's rows, whose batch index
    is ``batch[j]``. Lists of local indices are named ``local``, ``heads``, ``served``, ``rest``."""

    batch: list[int]  # local j -> batch row
    index: torch.Tensor  # ``batch`` as a LongTensor on the scores' device
    states: list[SamplerState]  # local j -> its sampler state

    def __len__(self) -> int:
        return len(self.batch)

    @property
    def params(self):
        return [st.params for st in self.states]

    def batch_index(self, local: list[int]) -> torch.Tensor:
        """The batch rows of local rows ``local`` (ascending), as a LongTensor: ``index`` itself for every row."""
        if len(local) == len(self.batch):
            return self.index
        return self.index[torch.tensor(local, device=self.index.device)]


def restore_dead_rows_(scores: torch.Tensor, rows: list[int], source: torch.Tensor) -> None:
    """Rows of ``scores`` (batch indices ``rows``) with no finite logit left take their values from
    ``source`` (row j of source is batch row rows[j])."""
    index = torch.tensor(rows, dtype=torch.long, device=scores.device)
    dead = scores.index_select(0, index).amax(-1) == NEG_INF
    if not bool(dead.any()):
        return
    local = dead.nonzero()[:, 0]
    scores[index[local]] = source.index_select(0, local.to(source.device)).to(scores.dtype)
