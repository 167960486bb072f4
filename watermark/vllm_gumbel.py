"""vLLM's built-in Gumbel watermark (vLLM 0.32, ``vllm/v1/watermarking/``), reproduced for detection.

How vLLM 0.32 derives a position's uniform (``prfs/philox.py``, ``prfs/base.py``), with the integer
key K (64 bits; key words k0 = K mod 2**32, k1 = K >> 32) and the context c_1..c_h (each token as an
unsigned 32-bit word; positions before the text start are -1, i.e. 0xFFFFFFFF):

* absorb: state = (0x574D4358, h, 0, 0); for each block of 4 context words (padded with
  0xFFFFFFFF - i at index i), state = Philox4x32-10(counter = state XOR block,
  key = (k0 XOR block offset, k1));
* per token v: out = Philox4x32-10(counter = (v >> 2, state0, state1, state2),
  key = (k0 XOR state3, k1 XOR 0x574D544B)), word = out[v & 3];
* u = float32(((word >> 8) + 1) / (2**24 + 1)), in (0, 1).

Sampling (GPU only: its CPU fallback exists but the V2 model runner that calls it needs Triton) is
argmax(logits + -log(-log u)). Its detector (``detector.py``, ``gumbel.py``: plain torch, no Triton)
pads the text start with -1, scores every position whose context is new (``deduplicate_contexts``,
on by default: dedup by CONTEXT, not by (context, token)), s = -log1p(-float64(u)), p-value the
Gamma(T, 1) survival of the sum.
"""

from __future__ import annotations

import numpy as np
import torch

from watermark.sampling_specs import VLLMGumbelSpec, sampling_fingerprint, vllm_key_from_secret

UINT32 = 0xFFFFFFFF
PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57  # Salmon et al. (SC'11), Philox4x32 multipliers
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85  # the Weyl key increments
CONTEXT_DOMAIN, TOKEN_DOMAIN = 0x574D4358, 0x574D544B  # vLLM's domain words ("WMCX", "WMTK")
PHILOX_ROUNDS = 10
START_PAD = -1  # vLLM's token id for positions before the text


def _mul_hi_lo(multiplier: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit halves of multiplier * x for x < 2**32 (the product fits 64 unsigned
    bits, but not int64, so it is assembled from 16-bit halves)."""
    xl, xh = x & 0xFFFF, x >> 16
    ml, mh = multiplier & 0xFFFF, multiplier >> 16
    low = xl * ml
    mid = xh * ml + xl * mh
    low_full = low + ((mid & 0xFFFF) << 16)
    high = (xh * mh + (mid >> 16) + (low_full >> 32)) & UINT32
    return high, low_full & UINT32


def philox4x32_10(counter: tuple, key: tuple) -> tuple:
    """Philox4x32-10 on 32-bit words held in int64 tensors or numpy uint64 arrays/scalars (broadcast
    shapes); numpy words take ``_philox_uint64``."""
    if any(isinstance(w, (np.ndarray, np.generic)) for w in counter):
        return _philox_uint64(counter, key)
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(PHILOX_ROUNDS):
        if round_index:
            k0 = (k0 + PHILOX_W0) & UINT32
            k1 = (k1 + PHILOX_W1) & UINT32
        hi0, lo0 = _mul_hi_lo(PHILOX_M0, c0)
        hi1, lo1 = _mul_hi_lo(PHILOX_M1, c2)
        c0, c1, c2, c3 = (hi1 ^ c1 ^ k0) & UINT32, lo1, (hi0 ^ c3 ^ k1) & UINT32, lo0
    return c0, c1, c2, c3


def _philox_uint64(counter: tuple, key: tuple) -> tuple:
    """The same rounds in numpy uint64: a 32 x 32-bit product is one multiply, and XORs of 32-bit words
    need no mask."""
    u64 = np.uint64
    m0, m1, w0, w1, shift, mask = (u64(PHILOX_M0), u64(PHILOX_M1), u64(PHILOX_W0), u64(PHILOX_W1), u64(32),
                                   u64(UINT32))
    c0, c1, c2, c3 = (np.asarray(c, dtype=u64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=u64) for k in key)
    for round_index in range(PHILOX_ROUNDS):
        if round_index:
            k0 = (k0 + w0) & mask
            k1 = (k1 + w1) & mask
        p0, p1 = c0 * m0, c2 * m1
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ k0, p1 & mask, (p0 >> shift) ^ c3 ^ k1, p0 & mask
    return c0, c1, c2, c3


def philox_words(key: int, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """vLLM's 32-bit word per (context row, token): contexts [N, h], token_ids [N, 1] or [V] -> [N, C]
    (int64). Computed in numpy uint64 (a 32 x 32-bit product in one multiply, no per-op dispatch)."""
    u64 = np.uint64
    contexts = np.asarray(torch.as_tensor(contexts).cpu().numpy(), dtype=np.int64).astype(u64) & u64(UINT32)
    contexts = np.ascontiguousarray(contexts.T)  # one contiguous row per context position
    h, n = contexts.shape
    k0, k1 = u64(key & UINT32), u64(key >> 32)
    state = [np.full(n, CONTEXT_DOMAIN, dtype=u64), np.full(n, h, dtype=u64), np.zeros(n, dtype=u64),
             np.zeros(n, dtype=u64)]
    for offset in range(0, h, 4):
        block = [contexts[offset + i] if offset + i < h else u64(UINT32 - i) for i in range(4)]
        counter = tuple(state[i] ^ block[i] for i in range(4))
        state = list(philox4x32_10(counter, (k0 ^ u64(offset), k1)))  # one key for every row
    tokens = np.asarray(torch.as_tensor(token_ids).cpu().numpy(), dtype=np.int64).astype(u64) & u64(UINT32)
    tokens = tokens[None, :] if tokens.ndim == 1 else tokens
    column = [s[:, None] for s in state]
    out = philox4x32_10((tokens >> u64(2), column[0], column[1], column[2]),
                        (k0 ^ column[3], k1 ^ u64(TOKEN_DOMAIN)))
    lane = tokens & u64(3)
    word = np.where(lane == 0, out[0], out[1])
    word = np.where(lane == 2, out[2], word)
    word = np.where(lane == 3, out[3], word)
    return torch.from_numpy(np.ascontiguousarray(word.astype(np.int64)))


def philox_uniforms(words: torch.Tensor) -> torch.Tensor:
    """vLLM's uint32 -> float32 uniform: ((word >> 8) + 1) / (2**24 + 1)."""
    return (((words & UINT32) >> 8).to(torch.float64) + 1.0).div(2**24 + 1).to(torch.float32)


class VLLMGumbel:
    """Detection of vLLM's Gumbel watermark under one key: vLLM's own units, scores and test."""

    def __init__(self, spec: VLLMGumbelSpec | str, secret: bytes | None, vocab_size: int,
                 key_id: str | None = None, vllm_key: int | None = None) -> None:
        self.spec = VLLMGumbelSpec.parse(spec) if isinstance(spec, str) else spec
        if not isinstance(self.spec, VLLMGumbelSpec):
            raise ValueError(f"VLLMGumbel needs a vllm:gumbel spec, got {self.spec.format()!r}")
        if vllm_key is None:
            if not secret:
                raise ValueError("a vllm:gumbel watermark needs a key")
            vllm_key = vllm_key_from_secret(bytes(secret))
        if isinstance(vllm_key, bool) or not isinstance(vllm_key, int) or not 0 <= vllm_key < 2**64:
            raise ValueError("vllm key: expected an integer in 0..2**64-1")
        self._key = vllm_key
        self.vocab_size = vocab_size
        self.key_id = key_id
        self.fingerprint = sampling_fingerprint(self.spec, vocab_size)

    def __repr__(self) -> str:
        return f"VLLMGumbel({self.spec.format()!r}, key_id={self.key_id!r}, V={self.vocab_size})"

    @property
    def context_width(self) -> int:
        return self.spec.context_width

    def uniforms(self, contexts: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """vLLM's float32 u for contexts [N, h] and token ids [N, 1] (or [V] for every token)."""
        return philox_uniforms(philox_words(self._key, contexts, token_ids))

    def gumbel_noise(self, contexts: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """vLLM's sampling noise -log(-log u) [N, V] (float32, u clamped at the smallest normal)."""
        u = self.uniforms(contexts, torch.arange(vocab_size or self.vocab_size))
        return -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float32).tiny)))

    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores s = -log1p(-u) [T] (float64) and each position's unit [T, h]: its context, padded
        with -1 before the text start. vLLM counts a unit once (``deduplicate_contexts``)."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        h = self.context_width
        padded = torch.cat([torch.full((h,), START_PAD, dtype=torch.int64), ids])
        if ids.shape[0] == 0:
            return torch.zeros(0, dtype=torch.float64), ids.new_zeros((0, h))
        contexts = padded.unfold(0, h, 1)[: ids.shape[0]]
        u = self.uniforms(contexts, ids.unsqueeze(1))[:, 0]
        return -torch.log1p(-u.to(torch.float64)), contexts
