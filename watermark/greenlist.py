"""Green-list membership: one function, two shapes.

``green(tables, gamma, contexts [N, h], candidates [1 or N, C]) -> bool [N, C]``

* generation: contexts are the last h tokens of each of B rows and candidates the whole
  vocabulary ``arange(V)[None]``: a [B, V] mask, as a handful of tensor operations on the logits'
  device (no loop over rows or vocabulary, no randperm).
* detection: contexts are the windows before each of T scored positions and candidates the
  tokens actually there ``ids[:, None]``: [T, 1] flags.
"""

from __future__ import annotations

import threading

import torch

from watermark.prf import green_threshold, mix64, vocab_mix_table
from watermark.seeding import SeedTables, context_seeds


class Workspace(threading.local):
    """Reusable int64 buffers for the generation path: fresh multi-megabyte tensors every step
    cost more in page faults than the arithmetic itself."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, str], torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, int], device: torch.device) -> torch.Tensor:
        key = (name, str(device))
        buf = self.buffers.get(key)
        numel = shape[0] * shape[1]
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=torch.int64, device=device)
            self.buffers[key] = buf
        return buf[:numel].view(shape)


_workspace = Workspace()


def green(tables: SeedTables, gamma: float, contexts: torch.Tensor, candidates: torch.Tensor | None,
          reuse_buffers: bool = False) -> torch.Tensor:
    """Whether each candidate is green after its context (shapes in the module docstring).

    ``candidates=None`` is the generation shape over the whole vocabulary; ``reuse_buffers``
    keeps the int64 intermediates in per-thread buffers (the returned mask is always fresh)."""
    device = contexts.device
    token_mix = vocab_mix_table(tables.vocab_size, device)
    token_mix = token_mix.unsqueeze(0) if candidates is None else token_mix[candidates]
    shape = torch.broadcast_shapes((contexts.shape[0], 1), token_mix.shape)
    if reuse_buffers:
        work = _workspace.get("work", shape, device)
        scratch = _workspace.get("scratch", shape, device)
        mixed = _workspace.get("mixed", shape, device)
    else:
        work = scratch = mixed = None
    seeds = context_seeds(tables, contexts, candidates, work=work, scratch=scratch)
    if seeds.shape[0] != shape[0]:
        seeds = seeds.expand(shape[0], seeds.shape[1])  # unigram: one key-wide seed for every row
    # seeds may live in `work`; `scratch` is free again for the multiplier
    mixed = mix64(seeds, token_mix, out=mixed, scratch=scratch)
    return mixed < green_threshold(gamma)


def candidates_all(vocab_size: int, device: torch.device) -> torch.Tensor:
    """[1, V] candidate ids for the generation shape."""
    return torch.arange(vocab_size, device=device).unsqueeze(0)
