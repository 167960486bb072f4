"""Sibling projections that read the same input, run as one packed matmul (engine's view of the model only).

An HF attention block calls ``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)`` one after another on the same
``x``, and a gated MLP calls ``gate_proj(x)`` then ``up_proj(x)``. At decode batch sizes each of those
matmuls is short, so calling oneDNN once over the concatenated weights ([q; k; v] is 960 x 576 for the
default model, [gate; up] 3072 x 576) costs less than three or two calls. The model's forward code is not
changed: the first sibling computes every sibling's output and leaves the others in a one-entry stash keyed
by the input tensor itself; a sibling that finds its input there returns its slice, and one that does not
(another caller, another order, another thread) computes its own output from its own plain weight. The
result is therefore always exactly ``x @ W_i.T (+ b_i)``, whatever the call pattern.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from generation.cpu.packed_linear import PACK_BATCH_HINT, PLAIN_BELOW_ROWS

# The projection groups of Llama-style blocks (and most HF decoders that follow its naming).
SIBLING_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProjections:
    """One packed weight for several linears with the same input; hands each caller its slice."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        weights = [lin.weight.detach() for lin in linears]
        biases = [lin.bias for lin in linears]
        if any((b is None) != (biases[0] is None) for b in biases):
            raise ValueError("fused projections must all have a bias or all have none")
        self.sizes = [w.shape[0] for w in weights]
        self.plain_below_rows = PLAIN_BELOW_ROWS.get(weights[0].dtype, 0)
        self.in_features = weights[0].shape[1]
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(torch.cat(weights), PACK_BATCH_HINT)
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self._stash = threading.local()  # (input, outputs) of this thread's last fused call
        self.decode_kernel, self.decode_kernel_rows = None, 0  # as PackedLinear's, over the concatenated weights

    def compute(self, x: torch.Tensor) -> torch.Tensor | None:
        """The siblings' outputs side by side ([..., sum(sizes)]), or None when ``x`` is too small to fuse."""
        if self.decode_kernel is not None and x.numel() <= self.decode_kernel_rows * self.in_features:
            return self.decode_kernel(x)
        if x.numel() < self.plain_below_rows * self.in_features:
            return None
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def first(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every sibling's output for ``x`` (stashed for the others), or None when ``x`` is too small to fuse."""
        fused = self.compute(x)
        if fused is None:
            return None
        outputs = list(fused.split(self.sizes, dim=-1))
        self._stash.entry = (x, outputs, [False] * len(outputs))
        return outputs

    def take(self, x: torch.Tensor, index: int) -> torch.Tensor | None:
        """Sibling ``index``'s stashed output for this very ``x`` (each handed out once), else None."""
        entry = getattr(self._stash, "entry", None)
        if entry is None or entry[0] is not x or entry[2][index]:
            return None
        entry[2][index] = True
        if all(entry[2]):
            self._stash.entry = None  # every slice handed out: do not keep the input alive
        return entry[1][index]


class FusedMember(nn.Module):
    """Stands in for one linear of a fused group; ``index`` 0 triggers the fused call."""

    def __init__(self, group: FusedProjections, index: int, linear: nn.Linear) -> None:
        super().__init__()
        self.group, self.index = group, index
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach()  # the caller's tensor (no copy): the fallback path
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index == 0 and self.group.first(x) is not None:
            return self.group.take(x, 0)
        got = self.group.take(x, self.index)
        if got is not None:
            return got
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"fused {self.index + 1} of {len(self.group.sizes)}")


def fuse_siblings_(view: nn.Module) -> int:
    """Replace every complete sibling group (SIBLING_GROUPS) of plain nn.Linear in ``view``; returns how many."""
    fused = 0
    for parent in list(view.modules()):
        for names in SIBLING_GROUPS:
            linears = [getattr(parent, name, None) for name in names]
            if not all(type(lin) is nn.Linear for lin in linears):
                continue
            if len({lin.in_features for lin in linears}) != 1 or len({lin.weight.dtype for lin in linears}) != 1:
                continue
            if any((lin.bias is None) != (linears[0].bias is None) for lin in linears):
                continue
            group = FusedProjections(linears)
            for index, (name, lin) in enumerate(zip(names, linears)):
                setattr(parent, name, FusedMember(group, index, lin))
            fused += 1
    return fused
