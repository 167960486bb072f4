"""WatermarkProcessor: per-row watermarks over one batch of logits.

Rows of one batch may carry different specs and keys, or none; rows sharing a spec and key
(equal ``Watermark.batch_key``, even from different Watermark objects: one per request) are biased
together in one vectorised call."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from watermark.scheme import Watermark


class WatermarkProcessor:
    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]],
              rows: Sequence[Watermark | None]) -> torch.Tensor:
        """Bias ``logits`` [B, V] in place: row i by ``rows[i]`` given its token history
        (prompt and generated ids so far). Rows with None, or with a history shorter than the
        watermark's context width, are left untouched."""
        if len(histories) != logits.shape[0] or len(rows) != logits.shape[0]:
            raise ValueError("histories and rows must have one entry per logits row")
        groups: dict[tuple, tuple[Watermark, list[int]]] = {}
        for i, wm in enumerate(rows):
            if wm is not None:
                groups.setdefault(wm.batch_key, (wm, []))[1].append(i)
        for wm, idx in groups.values():
            if len(idx) == logits.shape[0]:
                wm.bias(logits, [list(h) for h in histories])
                continue
            index = torch.tensor(idx, device=logits.device)
            part = logits.index_select(0, index)
            wm.bias(part, [list(histories[i]) for i in idx])
            logits.index_copy_(0, index, part)
        return logits

    __call__ = apply
