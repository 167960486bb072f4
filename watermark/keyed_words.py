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

import operator
import threading
from itertools import compress

import numpy as np
import torch

from watermark.prf import MASK64, SEED_MULTIPLIER, KeyedPRF, mix64, to_signed64, vocab_mix_table

CONTEXT_CACHE_SIZE = 65536  # without the C kernel, repeated contexts (templates, a long prompt) skip the PRF call
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
    """PRF_key(domain, scheme, context) for rows of contexts. With the C kernel (``watermark.prf_kernel``)
    every row goes to one batch call, uncached: ~0.14 us a row, near the ~0.1 us of a cache hit from Python
    and far below the ~0.5 us of a cache miss, so new and repeated contexts cost the same. Without it (or
    for sha3-256), one PRF call per distinct context, then cached."""

    def __init__(self, secret: bytes, prf: str, scheme: str) -> None:
        self._prf = KeyedPRF(secret, prf, scheme)
        self._cache: dict[bytes, bytes] = {}  # PRF message -> its 8 seed bytes
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ContextSeeds({self._prf!r})"

    def clear(self) -> None:
        """Forget every cached seed (what a text of new contexts costs is then measurable)."""
        with self._lock:
            self._cache.clear()

    def seeds(self, contexts: torch.Tensor) -> torch.Tensor:
        """[N, h] contexts -> [N, 1] int64 seeds (one PRF call per context not in the cache)."""
        values = self.seed_values(np.ascontiguousarray(contexts.cpu().numpy()))
        return torch.from_numpy(values).reshape(-1, 1).to(contexts.device)

    def seed_values(self, contexts: np.ndarray) -> np.ndarray:
        """``seeds`` on a numpy array [N, h] -> [N] int64. Without the C kernel rows are cached by their PRF
        message (the packed context), so a cached row costs one bytes object and a dict lookup."""
        rows, width = contexts.shape[0], contexts.shape[1] * 4
        if rows == 0:
            return np.zeros(0, dtype=np.int64)
        if contexts.size and (contexts.min() < 0 or contexts.max() > 0xFFFFFFFF):
            bad = contexts[(contexts < 0).any(axis=1) | (contexts > 0xFFFFFFFF).any(axis=1)][0]
            self._prf.seed(bad.tolist())  # raises, as packing any id outside uint32 does
        packed = contexts.astype("<u4", order="C")  # row i is the message PRF.seed would pack
        words = self._prf.packed_seed_words(packed.tobytes(), width) if width else None
        if words is not None:
            return np.frombuffer(words, dtype="<i8").astype(np.int64)
        # one bytes object per row (a void view: no per-row slicing)
        messages = packed.view(f"V{width}").ravel().tolist() if width else [b""] * rows
        cache = self._cache
        with self._lock:
            found = list(map(cache.get, messages))
        try:
            packed = b"".join(found)
        except TypeError:  # a row not in the cache (None)
            missing = list(dict.fromkeys(compress(messages, map(operator.not_, found))))
            words = self._prf.seed_words(missing)
            computed = dict(zip(missing, np.frombuffer(words, dtype="V8").tolist()))
            with self._lock:
                if len(cache) + len(computed) > CONTEXT_CACHE_SIZE:
                    cache.clear()  # a full cache starts over (cheaper than evicting row by row)
                cache.update(computed)
            get = computed.__getitem__
            packed = b"".join([hit or get(m) for m, hit in zip(messages, found)])
        return np.frombuffer(packed, dtype="<i8").astype(np.int64)


def keyed_words(seeds: torch.Tensor, candidates: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """fmix64(mix64(seed, T[v])): [N, V] for ``candidates=None`` (the whole vocabulary), else
    [N, C] for candidate ids [N, C]. ``seeds`` is [N, 1]."""
    table = vocab_mix_table(vocab_size, seeds.device)
    token_mix = table.unsqueeze(0) if candidates is None else table[candidates]
    return fmix64(mix64(seeds, token_mix))


def keyed_word_values(seeds: np.ndarray, tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """``keyed_words`` for detection, in numpy uint64: seeds [N] (int64) and one token id each [N] -> [N].
    The same wrapping integer arithmetic bit for bit; numpy runs it without torch's per-op dispatch."""
    u64 = np.uint64
    seeds = seeds.view(u64)
    table = vocab_mix_table(vocab_size).numpy().view(u64)
    x = (seeds ^ table[tokens]) * ((seeds * u64(SEED_MULTIPLIER & MASK64)) | u64(1))  # mix64
    x = (x ^ (x >> u64(30))) * u64(_FMIX_M1 & MASK64)  # fmix64: logical shifts, as uint64's are
    x = (x ^ (x >> u64(27))) * u64(_FMIX_M2 & MASK64)
    return x ^ (x >> u64(31))


def one_minus_r_values(words: np.ndarray) -> np.ndarray:
    """``uniform_parts(words)[1]`` for uint64 words: (2**52 - k - 1/2) / 2**52, every step exact."""
    return (_TWO52 - (words >> np.uint64(12)).astype(np.float64) - 0.5) / _TWO52


def uniform_parts(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, 1 - r) in float64 from words: r = (top 52 bits + 1/2) / 2**52, both exact."""
    top = _shift_right_logical(words, 12).to(torch.float64)
    return (top + 0.5) / _TWO52, (_TWO52 - top - 0.5) / _TWO52
