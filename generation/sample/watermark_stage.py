"""The LogitsPipeline's watermark stage: what a watermark scheme plugs into the pipeline.

A stage serves the rows whose watermark names it. It may **transform** the logits (the KGW bias:
``transform_``) and, when ``chooses_tokens`` is True, **choose** each sampled row's token in place of
the pipeline's draw (a Gumbel-max or SynthID tournament sampler: ``choose``). A Watermark names its
stage with a ``pipeline_stage`` attribute; sampling specs get ``sampling_stage.SAMPLING_STAGE``, the
others (KGW, hf) the KGW bias stage.
Every call gets each row's context (its last ``context_width`` tokens, computed once per row per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from generation.sample.sampling_stage import SAMPLING_STAGE, is_sampling_mark
from watermark.processor import WatermarkProcessor
from watermark.scheme import Watermark


class WatermarkStage(Protocol):
    """Stage 4 of generation.sample.pipeline.LogitsPipeline for the rows it serves."""

    chooses_tokens: bool  # True: ``choose`` replaces the draw for this stage's sampled rows

    def transform_(self, scores: torch.Tensor, contexts: Sequence[Sequence[int]],
                   marks: Sequence[Watermark | None], code: Sequence[bool] | None = None) -> None:
        """Change ``scores`` [B, V] in place for rows whose mark is not None (others untouched); ``code``: the
        rows whose output reads as code so far (``watermark.text_kind``), None when nobody asked."""

    def choose(self, probs: torch.Tensor, contexts: Sequence[Sequence[int]], marks: Sequence[Watermark],
               generators: Sequence[torch.Generator]) -> torch.Tensor:
        """One token per row of ``probs`` [R, V] (after temperature and truncation); LongTensor [R]."""


class KGWBiasStage:
    """The KGW family (Kirchenbauer et al. 2023; hf-compatible specs too): +delta on green logits, or red
    logits to -inf (hard). Rows sharing a spec and key are biased in one vectorised call."""

    chooses_tokens = False
    reads_kind = True  # takes each row's code flag (a spec's code_delta)

    def __init__(self) -> None:
        self._processor = WatermarkProcessor()

    def transform_(self, scores: torch.Tensor, contexts: Sequence[Sequence[int]],
                   marks: Sequence[Watermark | None], code: Sequence[bool] | None = None) -> None:
        self._processor.apply(scores, contexts, marks, code)

    def choose(self, probs, contexts, marks, generators) -> torch.Tensor:
        raise TypeError("the KGW bias stage transforms logits; it does not choose tokens")


KGW_BIAS = KGWBiasStage()  # stateless: one instance serves every pipeline


def stage_for(mark: Watermark) -> WatermarkStage:
    """The stage a watermark names (``pipeline_stage``); the sampling stage for a sampling spec
    (gumbel, synthid, hf:synthid); else the KGW bias."""
    stage = getattr(mark, "pipeline_stage", None)
    if stage is not None:
        return stage
    return SAMPLING_STAGE if is_sampling_mark(mark) else KGW_BIAS
