"""``scores.topk(size)`` for the top-k heads (sampler.head_distributions), faster where the answer is unique.

torch.topk on CPU partially sorts (value, id) pairs of the whole row: ~2 ms for 16 rows of 49152, most
of a sampling watermark's step in the vLLM plugin. A backend (the engine's C++ kernel, registered by the
engine and the plugin like the watermark backends) returns the head of every row whose top size + 1
values are distinct, where any correct top-k agrees with torch's; rows with ties (half-precision logits
tie often) or NaN keep torch.topk, whose tie order the later stages' positional cuts can depend on.
"""

from __future__ import annotations

import torch

_backend = None


def set_top_head_backend(backend) -> None:
    """``backend(scores, size) -> (values, ids, ok) or None`` (see ``generation.cpu.native.top_head``), or
    None for torch.topk alone."""
    global _backend
    _backend = backend


def top_head(scores: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) equal to ``scores.topk(size)``'s, for scores [R, V]."""
    found = _backend(scores, size) if _backend is not None and size < scores.shape[-1] else None
    if found is None:
        return scores.topk(size)
    values, ids, ok = found
    if bool(ok.all()):
        return values, ids
    rest = (~ok).nonzero()[:, 0]
    rest_values, rest_ids = scores.index_select(0, rest).topk(size)
    values[rest], ids[rest] = rest_values, rest_ids
    return values, ids
