"""The engine's own view of a model: its module tree again, sharing every parameter, with each nn.Linear
packed for oneDNN (packed_linear.py) and q/k/v and gate/up fused into one matmul each (fused_linear.py)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from generation.cpu.fused_linear import fuse_siblings_
from generation.cpu.packed_linear import PackedLinear, packing_available


def packed_view(model: nn.Module, fuse_siblings: bool = True) -> nn.Module:
    """A copy of ``model``'s module tree sharing its parameters, with every nn.Linear packed.

    ``fuse_siblings``: q/k/v and gate/up projections run as one packed matmul each
    (generation/cpu/fused_linear.py). Raises ValueError if packing is not available for this model
    (see ``packing_available``)."""
    if not packing_available(model):
        raise ValueError("packed linear weights need a CPU model in float32/bfloat16/float16 and torch's oneDNN ops")
    shared = {id(t): t for t in list(model.parameters()) + list(model.buffers())}  # deepcopy reuses these
    view = copy.deepcopy(model, memo=shared)
    with torch.inference_mode():
        if fuse_siblings:
            fuse_siblings_(view)
        for parent in list(view.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, PackedLinear(child))
    return view.eval()
