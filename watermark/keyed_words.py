"""Keyed 64-bit words per (context, token), the random source of the sampling watermarks.

As the PRF contract says, a position costs one PRF call (its h prior tokens, jointly) and the whole
vocabulary is then one tensor expression::

    seed     = PRF_key(domain, scheme, h prior tokens)          one call per position (cached)
    word[v]  = fmix64(mix64(seed, T[v]))                        fixed integer mixers over all v

``mix64`` is the KGW mixer (``watermark.prf``); ``fmix64`` is SplitMix64's output function, a
bijection that spreads every input bit over every output bit, because the Gumbel scores read the
low bits of ``1 - r`` and SynthID reads one bit per layer (``mix64``'s low bits depend only on the
inputs' low bits). torch has no unsigned 64-bit type: words are int64 and logical shifts are masked.

Uniforms: ``r = (k + 1/2) / 2**52`` with k the word's top 52 bits, so r is never 0 or 1 (both
need only 53 significant bits, exact in float64) and ``1 - r = (2**52 - k - 1/2) / 2**52`` is
computed exactly (no cancellation near r = 1).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from watermark.prf import KeyedPRF, mix64, to_signed64, vocab_mix_table

CONTEXT_CACHE_SIZE = 65536  # repeated contexts (templates, a long prompt) skip the PRF call
_FMIX_M1 = to_signed64(0xBF58476D1CE4E5B9)
_FMIX_M2 = to_signed64(0x94D049BB133111EB)
_TWO52 = float(2**52)


def _shift_right_logical(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def fmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output function on int64 tensors (wrapping arithmetic)."""
    x = (x ^ _shift_right_logical(x, 30)) * _FMIX_M1
    x = (x ^ _shift_right_logical(x, 27)) * _FMIX_M2
    return x ^ _shift_right_logical(x, 31)


def fmix64_reference(x: int) -> int:
    """Pure-Python fmix64 on one unsigned 64-bit integer: the specification the tensor code is tested against."""
    mask = (1 << 64) - 1
    x &= mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


class ContextSeeds:
    """PRF_key(domain, scheme, context) for rows of contexts: one PRF call per distinct context."""

    def __init__(self, secret: bytes, prf: str, scheme: str) -> None:
        self._prf = KeyedPRF(secret, prf, scheme)
        self._cache: OrderedDict[tuple[int, ...], int] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ContextSeeds({self._prf!r})"

    def seeds(self, contexts: torch.Tensor) -> torch.Tensor:
        """[N, h] contexts -> [N, 1] int64 seeds (one PRF call per context not in the cache)."""
        rows = list(map(tuple, np.ascontiguousarray(contexts.cpu().numpy()).tolist()))
        cache = self._cache
        with self._lock:
            found = [cache.get(row) for row in rows]
        computed = {row: self._prf.seed(row) for row, hit in zip(rows, found) if hit is None}
        if computed:
            with self._lock:
                cache.update(computed)
                while len(cache) > CONTEXT_CACHE_SIZE:
                    cache.popitem(last=False)
        values = [hit if hit is not None else computed[row] for row, hit in zip(rows, found)]
        return torch.tensor(values, dtype=torch.int64, device=contexts.device).reshape(-1, 1)


def keyed_words(seeds: torch.Tensor, candidates: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """fmix64(mix64(seed, T[v])): [N, V] for ``candidates=None`` (the whole vocabulary), else
    [N, C] for candidate ids [N, C]. ``seeds`` is [N, 1]."""
    table = vocab_mix_table(vocab_size, seeds.device)
    token_mix = table.unsqueeze(0) if candidates is None else table[candidates]
    return fmix64(mix64(seeds, token_mix))


def uniform_parts(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, 1 - r) in float64 from words: r = (top 52 bits + 1/2) / 2**52, both exact."""
    top = _shift_right_logical(words, 12).to(torch.float64)
    return (top + 0.5) / _TWO52, (_TWO52 - top - 0.5) / _TWO52
