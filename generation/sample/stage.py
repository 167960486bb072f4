"""WatermarkStage: everything a watermark scheme may plug into stage 5 of the LogitsPipeline
(generation.sample.pipeline), each hook declared here with its default.

A stage serves the rows whose watermark names it. It may **transform** the logits in stage 5 (the KGW bias:
``transform_``; with ``reads_kind`` it also gets each row's code flag) and, when ``chooses_tokens`` is True,
**choose** each sampled row's token in stage 8, in place of the pipeline's draw (a Gumbel-max or SynthID
tournament sampler: ``choose``; with ``takes_candidates`` a top-k row may come as its head only).
Every call gets each row's context (its last ``context_width`` tokens, computed once per row per step).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class WatermarkStage:
    """Stage 5 of the LogitsPipeline for the rows it serves (and stage 8 for a stage that chooses tokens)."""

    chooses_tokens: bool = False  # True: ``choose`` replaces stage 8's draw for this stage's sampled rows
    reads_kind: bool = False  # True: ``transform_`` gets ``code``, each row's "reads as code" flag
    takes_candidates: bool = False  # True: ``choose`` may get a top-k row's head (``candidates``) only

    def transform_(self, scores: torch.Tensor, contexts: Sequence[Sequence[int]], marks: Sequence,
                   code: Sequence[bool] | None = None) -> None:
        """Change ``scores`` [B, V] in place for rows whose mark is not None (others untouched); ``code``: the
        rows whose output reads as code so far (``watermark.text_kind``), given only with ``reads_kind``.
        The default leaves the logits alone (a stage that only chooses)."""
        return None

    def choose(self, probs: torch.Tensor, contexts: Sequence[Sequence[int]], marks: Sequence,
               generators: Sequence[torch.Generator], candidates: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row of ``probs`` [R, V] (after stages 6-7); LongTensor [R]. With ``candidates``
        [R, C] (ascending token ids; only for ``takes_candidates``), ``probs`` [R, C] is the distribution over
        those ids and every other token has probability 0."""
        raise TypeError(f"{type(self).__name__} transforms logits; it does not choose tokens")
