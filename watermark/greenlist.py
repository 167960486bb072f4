"""Green-list membership: one function, two shapes.

``green(tables, gamma, contexts [N, h], candidates [N, C] or None) -> bool [N, C]``

* detection: contexts are the windows before each of T scored positions and candidates the
  tokens actually there ``ids[:, None]``: [T, 1] flags.
* generation: contexts are the last h tokens of each of B rows and the candidates the whole
  vocabulary (``None``): a [B, V] mask. ``bias_logits`` applies it to logits through the same
  seed and mixer functions, compiled with ``torch.compile`` into one fused pass over [B, V] when
  a compiler is available (``PROVMARK_COMPILE=0`` turns that off), eagerly otherwise. Either way:
  a handful of tensor operations on the logits' device, no loop over rows or vocabulary.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from watermark.prf import green_threshold, mix64, vocab_mix_table
from watermark.seeding import SeedTables, context_seeds, selfhash_seeds

log = logging.getLogger(__name__)


def green(tables: SeedTables, gamma: float, contexts: torch.Tensor,
          candidates: torch.Tensor | None, return_seeds: bool = False):
    """Whether each candidate is green after its context (shapes in the module docstring).

    With ``return_seeds`` also the seeds (broadcastable to the result) that decided it."""
    token_mix = vocab_mix_table(tables.vocab_size, contexts.device)
    token_mix = token_mix.unsqueeze(0) if candidates is None else token_mix[candidates]
    seeds = context_seeds(tables, contexts, candidates)
    flags = mix64(seeds, token_mix) < green_threshold(gamma)
    return (flags, seeds) if return_seeds else flags


# ---- the generation hot path -------------------------------------------------------------------
def _bias_from_seeds(logits: torch.Tensor, seeds: torch.Tensor, token_mix: torch.Tensor,
                     threshold: int, delta: float, hard: bool) -> torch.Tensor:
    is_green = mix64(seeds, token_mix) < threshold
    if hard:
        return logits.masked_fill_(~is_green, float("-inf"))
    return logits.add_(is_green.to(logits.dtype), alpha=delta)


def _bias_selfhash(logits: torch.Tensor, context_values: torch.Tensor, salt: torch.Tensor,
                   own: torch.Tensor, token_mix: torch.Tensor, threshold: int, delta: float,
                   hard: bool) -> torch.Tensor:
    seeds = selfhash_seeds(context_values, salt, own)
    return _bias_from_seeds(logits, seeds, token_mix, threshold, delta, hard)


class _Kernels:
    """The two bias functions, compiled on first use; eager if compiling is off or fails."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = os.environ.get("PROVMARK_COMPILE", "1") not in ("0", "false", "no")
        self.compiled: dict[str, object] = {}

    def call(self, name: str, eager, *args):
        if not self.enabled:
            return eager(*args)
        fn = self.compiled.get(name)
        if fn is None:
            with self.lock:
                fn = self.compiled.get(name)
                if fn is None:
                    fn = torch.compile(eager, dynamic=True)
                    self.compiled[name] = fn
        try:
            return fn(*args)
        except Exception as exc:  # no compiler, unsupported device: the eager path is the same math
            log.warning("torch.compile unavailable for the watermark bias (%s); using eager tensors",
                        type(exc).__name__)
            self.enabled = False
            return eager(*args)


kernels = _Kernels()


# An optional faster implementation of the same bias, registered by a caller that has one (the generation
# engine registers its C++ kernel, generation/cpu/native.py); it returns False for inputs it does not take.
_bias_backend = None


def set_bias_backend(backend) -> None:
    """``backend(logits, seeds or None, context_values or None, salt, own, token_mix, threshold, delta,
    hard) -> bool`` (True: done, in place), or None to go back to the tensor code."""
    global _bias_backend
    _bias_backend = backend


def bias_logits_rows(logits: torch.Tensor, tables: SeedTables, gamma: float, deltas: list[float],
                     contexts: torch.Tensor) -> torch.Tensor:
    """Soft bias of ``logits`` [B, V] in place, row b at its own ``deltas[b]`` (the same green lists as
    bias_logits): one pass through the backend where it takes per-row deltas, else one bias_logits call per
    distinct delta over that group of rows."""
    backend = _bias_backend
    if backend is not None:
        t = tables.tensors(logits.device)
        token_mix = vocab_mix_table(tables.vocab_size, logits.device).unsqueeze(0)
        row_deltas = torch.tensor(deltas, dtype=torch.float32)
        if tables.scheme == "selfhash":
            done = backend(logits, None, t["token"][contexts], t["salt"], t["self"], token_mix,
                           green_threshold(gamma), row_deltas, False)
        else:
            done = backend(logits, context_seeds(tables, contexts, None), None, None, None, token_mix,
                           green_threshold(gamma), row_deltas, False)
        if done:
            return logits
    for delta in dict.fromkeys(deltas):
        index = torch.tensor([b for b, d in enumerate(deltas) if d == delta], device=logits.device)
        part = logits.index_select(0, index)
        bias_logits(part, tables, gamma, delta, False, contexts.index_select(0, index))
        logits.index_copy_(0, index, part)
    return logits


def bias_logits(logits: torch.Tensor, tables: SeedTables, gamma: float, delta: float, hard: bool,
                contexts: torch.Tensor) -> torch.Tensor:
    """Soft (+delta on green) or hard (red -> -inf) bias of ``logits`` [B, V], in place."""
    device = logits.device
    t = tables.tensors(device)
    token_mix = vocab_mix_table(tables.vocab_size, device).unsqueeze(0)
    threshold = green_threshold(gamma)
    backend = _bias_backend
    if backend is not None:
        if tables.scheme == "selfhash":
            done = backend(logits, None, t["token"][contexts], t["salt"], t["self"], token_mix, threshold, delta, hard)
        else:
            done = backend(logits, context_seeds(tables, contexts, None), None, None, None, token_mix, threshold,
                           delta, hard)
        if done:
            return logits
    if tables.scheme == "selfhash":
        return kernels.call("selfhash", _bias_selfhash, logits, t["token"][contexts],
                            t["salt"].unsqueeze(0), t["self"].unsqueeze(0), token_mix, threshold,
                            delta, hard)
    seeds = context_seeds(tables, contexts, None)  # [B, 1]: cheap, one seed per row
    return kernels.call("seeded", _bias_from_seeds, logits, seeds, token_mix, threshold, delta, hard)
