"""Keyed tournament sampling (SynthID-Text, Dathathri et al., Nature 2024), generated and scored.

Layer d's g-function is bit d of the keyed word of (h prior tokens, token) (``watermark.keyed_words``):
g_d(context, v) in {0, 1}, and for a fixed context the bits of distinct tokens and layers are
independent fair coins (one PRF call per position, one mixer pass for all layers).

Generation: a tournament of 2^m candidates drawn from p, where each match keeps the candidate with the
larger g_d (ties at random), has the closed-form winner distribution, applied layer by layer:

    p <- p * (1 + g_d - E_p[g_d])        for d = 1 .. m

(two-candidate matches; the same update transformers' ``SynthIDTextWatermarkLogitsProcessor`` uses).
It returns log-probabilities to sample from with the request's own generator: over keys the token
is distributed as p (non-distortionary per token). The tournament is played among the ``top_k``
most likely tokens (default 40, as in DeepMind's synthid-text; 0 = the whole vocabulary, exact but
m passes over [B, V]). Temperature shapes p before the tournament, as for
Gumbel: lower temperature, less entropy, fewer g-values the tournament can move.

E_p[g_d] is summed in ascending token-id order in float64 and rounded to p's dtype
(``sequential_tournament``): the same bits on every machine (torch's ``sum`` orders its reduction by
the CPU's vector width), whether or not the zeros of truncated tokens are in the row, and in the
engine's C++ kernel (``set_tournament_backend``), which plays a head's 30 layers in a few microseconds
where the tensor ops take about 0.2 ms of dispatch at 16 rows.

Detection: under H0 each distinct (context, token) unit's m g-values are independent Bernoulli(1/2),
so the sum of g over T units and m layers is Binomial(T m, 1/2): exact p-value. The mean and
weighted mean g-values are SynthID's own scores.
"""

from __future__ import annotations

import numpy as np
import torch

from watermark.keyed_sampling import KeyedSamplingWatermark
from watermark.keyed_words import keyed_word_values, keyed_words
from watermark.sampling_common import ngram_units
from watermark.sampling_specs import SynthIDSpec


def layer_bits(words: torch.Tensor, layers: int) -> torch.Tensor:
    """g-values [..., m] (uint8) from keyed words [...]: bit d of the word is layer d's g."""
    shifts = torch.arange(layers, dtype=torch.int64, device=words.device)
    return ((words.unsqueeze(-1) >> shifts) & 1).to(torch.uint8)


def word_bits(words: np.ndarray, layers: int) -> np.ndarray:
    """``layer_bits`` for uint64 words [N] in numpy: [N, m] uint8, bit d of each word in column d. One
    unpackbits of the words' little-endian bytes: a tenth of the time of m shifts over [N, m] uint64."""
    as_bytes = np.ascontiguousarray(words, dtype="<u8").view(np.uint8).reshape(-1, 8)
    return np.unpackbits(as_bytes, axis=1, count=layers, bitorder="little")


def tournament_probs(probs: torch.Tensor, g_layer) -> torch.Tensor:
    """Apply the m two-candidate tournament layers to ``probs`` [B, V]; ``g_layer(d)`` gives layer d's
    g-values [B, V] as probs' dtype. Returns the winner distribution [B, V]."""
    d = 0
    while True:
        g = g_layer(d)
        if g is None:
            return probs
        mass = (g * probs).sum(dim=1, keepdim=True)
        probs = probs * (1 + g - mass)
        d += 1


def tournament_from_bits(probs: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """``tournament_probs`` with every layer's g-values given at once, ``bits`` [m, B, V] as probs' dtype:
    the same operations on the same values per layer (bit for bit), without m rounds of shifting and
    converting (hf:synthid's heads)."""
    one_plus = 1 + bits  # exactly 1 or 2, as ``1 + g`` per layer
    for d in range(bits.shape[0]):
        mass = (bits[d] * probs).sum(dim=1, keepdim=True)
        probs = probs * (one_plus[d] - mass)
    return probs


def sequential_tournament(probs: torch.Tensor, words: torch.Tensor, layers: int) -> torch.Tensor:
    """The tournament of ``synthid:`` specs: ``tournament_probs`` over probabilities [B, C] with layer d's
    g-values bit d of ``words`` [B, C], each layer's E_p[g] summed in column order in float64 (torch.cumsum
    accumulates so on the CPU) and rounded to p's dtype; negatives (a mass rounded above 1 makes 1 - mass < 0)
    set to 0 at the end. The definition the C++ backend reproduces."""
    backend = _tournament_backend(probs, words, layers) if _tournament_backend is not None else None
    if backend is not None:
        return backend
    for d in range(layers):
        g = ((words >> d) & 1).to(probs.dtype)
        mass = torch.cumsum(g * probs, dim=1)[:, -1:]
        probs = probs * ((1 + g) - mass)
    return probs.clamp_min(0)  # a mass rounded above 1 leaves its losers a hair below 0 (a copy: m may be 0)


_tournament_backend = None


def set_tournament_backend(backend) -> None:
    """``backend(probs, words, layers) -> winner probabilities or None`` (the engine's C++ kernel,
    ``generation.cpu.native.synthid_tournament``: the same bits), or None for the tensor ops alone."""
    global _tournament_backend
    _tournament_backend = backend


def probs_to_logits(probs: torch.Tensor) -> torch.Tensor:
    """log p with the dtype's lowest finite value for p = 0 (transformers' convention)."""
    log_probs = torch.log(probs)
    return torch.where(torch.isfinite(log_probs), log_probs, torch.finfo(log_probs.dtype).min)


class SynthIDWatermark(KeyedSamplingWatermark):
    """``SynthIDWatermark(spec, secret, vocab_size, key_id)``: keyed g-values, the tournament, scoring."""

    SPEC_TYPE = SynthIDSpec
    SCHEME = "synthid"

    @property
    def layers(self) -> int:
        return self.spec.layers

    @property
    def head_size(self) -> int:
        """The tournament's candidates per row: the ``top_k`` most likely tokens (0: the whole vocabulary).
        A caller may hand ``winner_distribution`` that head itself (ascending ids), found faster."""
        return self.spec.top_k

    @property
    def null_g_rate(self) -> float:
        """P(g = 1) under H0: a fair bit."""
        return 0.5

    def words(self, contexts: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        return keyed_words(self._seeds.seeds(contexts), candidates, self.vocab_size)

    # ---- generation -------------------------------------------------------------------------------
    def tournament_logits(self, logits: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [B, V] of the tournament winner for logits [B, V] (after temperature and
        truncation) and contexts [B, h]; sample from them as from any logits. With ``top_k`` > 0 the
        tournament is played among the k most likely tokens (the others get probability 0), as DeepMind's
        synthid-text does (``winner_distribution``)."""
        winner, ids = self.winner_distribution(torch.softmax(logits, dim=-1), contexts)
        if ids is None:
            return probs_to_logits(winner)
        out = torch.full_like(logits, torch.finfo(logits.dtype).min)
        return out.scatter_(1, ids, probs_to_logits(winner))

    def winner_distribution(self, probs: torch.Tensor, contexts: torch.Tensor,
                            candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The tournament of ``tournament_logits`` from probabilities ``probs`` [B, V] (after temperature and
        truncation), or [B, C] over token ids ``candidates`` (all others p = 0): (winner probabilities
        [B, K], their token ids [B, K] ascending), K = ``top_k``; with top_k 0 (or >= the columns) all
        columns, ids None for the whole vocabulary. Draw one index per row to sample."""
        seeds = self._seeds.seeds(contexts).to(probs.device)
        k = self.spec.top_k
        if k <= 0 or k >= probs.shape[-1]:
            base, ids = probs, candidates
        else:
            base, at = torch.topk(probs, k, dim=-1)
            ids = at if candidates is None else candidates.gather(1, at)
            ids, order = ids.sort(dim=-1)  # token-id order: the same draw from a head or the whole row
            base = base.gather(1, order)
        words = keyed_words(seeds, ids, self.vocab_size)
        base = base / torch.cumsum(base, dim=-1)[:, -1:]  # summed in id order too: a head = its whole row
        return sequential_tournament(base, words, self.layers), ids

    # ---- detection ------------------------------------------------------------------------------
    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """g-values [T - h, m] (uint8) and each position's unit [T - h, h + 1]."""
        units = ngram_units(token_ids, self.context_width)
        if units.shape[0] == 0:
            return torch.zeros((0, self.layers), dtype=torch.uint8), units
        rows = units.numpy()
        h = self.context_width
        words = keyed_word_values(self._seeds.seed_values(rows[:, :h]), rows[:, h], self.vocab_size)
        return torch.from_numpy(word_bits(words, self.layers)), units
