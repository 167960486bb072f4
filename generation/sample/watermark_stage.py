"""Which WatermarkStage (``generation.sample.stage``) serves a watermark's rows: the KGW bias stage here, or
the sampling watermarks' stage (``sampling_stage.SAMPLING_STAGE``), as the watermark's scheme family says; a
watermark that brings its own stage names it as ``pipeline_stage`` (the evaluation's spoofer)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from generation.sample.sampling_stage import SAMPLING_STAGE, is_sampling_mark
from generation.sample.stage import WatermarkStage
from watermark.processor import WatermarkProcessor
from watermark.scheme import Watermark


class KGWBiasStage(WatermarkStage):
    """The KGW family (Kirchenbauer et al. 2023; hf-compatible specs too): +delta on green logits, or red
    logits to -inf (hard). Rows sharing a spec and key are biased in one vectorised call."""

    chooses_tokens = False
    reads_kind = True  # takes each row's code flag (a spec's code_delta)

    def __init__(self) -> None:
        self._processor = WatermarkProcessor()

    def transform_(self, scores: torch.Tensor, contexts: Sequence[Sequence[int]],
                   marks: Sequence[Watermark | None], code: Sequence[bool] | None = None) -> None:
        self._processor.apply(scores, contexts, marks, code)


KGW_BIAS = KGWBiasStage()  # stateless: one instance serves every pipeline


def stage_for(mark: Watermark) -> WatermarkStage:
    """The stage a watermark names (``pipeline_stage``); the sampling stage for a sampling spec
    (gumbel, synthid, hf:synthid); else the KGW bias."""
    stage = getattr(mark, "pipeline_stage", None)
    if stage is not None:
        return stage
    return SAMPLING_STAGE if is_sampling_mark(mark) else KGW_BIAS
