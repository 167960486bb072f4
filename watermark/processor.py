"""WatermarkProcessor: per-row watermarks over one batch of logits.

Rows of one batch may carry different specs and keys, or none; rows sharing a spec and key
(equal ``Watermark.batch_key``, even from different Watermark objects: one per request) are biased
together in one vectorised call."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import torch

from watermark.config import WatermarkSpec
from watermark.scheme import Watermark

WARM_UP_ROWS = 2  # torch.compile specialises batch sizes 0 and 1; 2 gives the kernel a dynamic batch


class WatermarkProcessor:
    def apply(self, logits: torch.Tensor, histories: Sequence[Sequence[int]],
              rows: Sequence[Watermark | None], code: Sequence[bool] | None = None) -> torch.Tensor:
        """Bias ``logits`` [B, V] in place: row i by ``rows[i]`` given its token history
        (prompt and generated ids so far), at the spec's code_delta where ``code[i]`` is set. Rows with None,
        or with a history shorter than the watermark's context width, are left untouched."""
        if len(histories) != logits.shape[0] or len(rows) != logits.shape[0]:
            raise ValueError("histories and rows must have one entry per logits row")
        groups: dict[tuple, tuple[Watermark, list[int]]] = {}
        for i, wm in enumerate(rows):
            if wm is not None:
                groups.setdefault(wm.batch_key, (wm, []))[1].append(i)
        for wm, idx in groups.values():
            if len(idx) == logits.shape[0]:
                if code is None:
                    wm.bias(logits, [list(h) for h in histories])
                else:
                    wm.bias(logits, [list(h) for h in histories], list(code))
                continue
            index = torch.tensor(idx, device=logits.device)
            part = logits.index_select(0, index)
            if code is None:
                wm.bias(part, [list(histories[i]) for i in idx])
            else:
                wm.bias(part, [list(histories[i]) for i in idx], [code[i] for i in idx])
            logits.index_copy_(0, index, part)
        return logits

    __call__ = apply


def warm_up(vocab_size: int, spec: WatermarkSpec | None = None, device: torch.device | str = "cpu") -> None:
    """Bias a dummy batch once, so the fused kernel's first-call compile (about 5 s on a 2-core CPU)
    happens now rather than in the first watermarked request. Uses a throwaway random key."""
    spec = spec or WatermarkSpec.default()
    mark = Watermark(spec, secrets.token_bytes(32), vocab_size, key_id="warm-up")
    history = [0] * max(mark.context_width, 1)
    logits = torch.zeros(WARM_UP_ROWS, vocab_size, device=device)
    WatermarkProcessor().apply(logits, [history] * WARM_UP_ROWS, [mark] * WARM_UP_ROWS)
