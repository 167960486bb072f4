"""Keyed Gumbel-max sampling (Aaronson's exponential minimum), generated and scored.

Generation: with p the distribution left by every earlier stage (penalties, logit bias, temperature,
truncation, constraints) and r_v = PRF(key, h prior tokens, v) uniform in (0, 1), the token is

    argmax_v log(r_v) / p_v  =  argmax_v [log p_v - log(-log r_v)]  =  argmax_v [logits_v + G_v]

with G_v = -log(-log r_v) a standard Gumbel: over keys the token is distributed exactly as p (the
Gumbel-max trick), yet for a fixed key it is a deterministic function of (context, logits).
Truncated tokens (p_v = 0, logits -inf) never win. Temperature T enters through p = softmax(l / T):
T = 1 samples the model's own distribution; T < 1 sharpens p, so the race is more often won by the
argmax token whatever r is, and fewer positions carry evidence; T -> 0 is greedy (refused, see
``require_sampling``).

Detection: a position's score is s = -log(1 - r_token). Under H0 (text independent of the key) each
distinct (context, token) unit has r uniform, so s ~ Exp(1) independently and the sum S of T
counted units is Gamma(T, 1): p = P(Gamma(T, 1) >= S) = gammaincc(T, S), exact. Watermarked tokens
have r pushed towards 1 (they won a race with r_v^(1/p_v)), E[s] = sum_v p_v H(1/p_v) > 1.
"""

from __future__ import annotations

import torch

from watermark.greenlist import kernels
from watermark.keyed_sampling import KeyedSamplingWatermark
from watermark.keyed_words import fmix64, keyed_word_values, keyed_words, one_minus_r_values, uniform_parts
from watermark.prf import mix64, vocab_mix_table
from watermark.sampling_common import ngram_units
from watermark.sampling_specs import GumbelSpec


def gumbel_noise(one_minus_r: torch.Tensor) -> torch.Tensor:
    """G = -log(-log r) in float64, from 1 - r (precise for r near 1 and near 0)."""
    return -torch.log(-torch.log1p(-one_minus_r))


def gumbel_argmax(logits: torch.Tensor, one_minus_r: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max choice per row: argmax_v log(r_v) / p_v for p = softmax(logits) [B, V] -> [B]."""
    return torch.argmax(logits.to(torch.float64) + gumbel_noise(one_minus_r), dim=-1)


def _race(logits: torch.Tensor, seeds: torch.Tensor, token_mix: torch.Tensor) -> torch.Tensor:
    """keyed words -> 1 - r -> Gumbel noise -> argmax, one expression (fused by torch.compile)."""
    return gumbel_argmax(logits, uniform_parts(fmix64(mix64(seeds, token_mix)))[1])


# Slack on the pruning bound (relative): float32 probabilities, their float64 logs and the reference's
# exp differ from exact arithmetic by ~1e-7 relative; 1e-4 keeps every possible winner, prunes as well.
PRUNE_SLACK = 1e-4


def _race_candidates(probs: torch.Tensor, seeds: torch.Tensor, token_mix: torch.Tensor,
                     bound: torch.Tensor) -> torch.Tensor:
    """Tokens that can still win the race: 1 - r_v <= bound * p_v (integer mixing, no logarithm)."""
    return uniform_parts(fmix64(mix64(seeds, token_mix)))[1] <= bound * probs.to(torch.float64)


# An optional faster way to the survivors (the same race, a bound at least as wide), registered by a caller
# that has one (the engine registers its C++ kernel, generation/cpu/native.py); it returns None for inputs
# it does not take.
_survivors_backend = None


def set_survivors_backend(backend) -> None:
    """``backend(probs, seeds, token_mix, slack) -> (rows, token ids) or None``, or None for the tensor code."""
    global _survivors_backend
    _survivors_backend = backend


def race_scores(probs: torch.Tensor, one_minus_r: torch.Tensor) -> torch.Tensor:
    """The race's score log p_v + G_v in float64 (the one formula every choice path compares)."""
    return torch.log(probs.to(torch.float64)) + gumbel_noise(one_minus_r)


def exponential_scores(one_minus_r: torch.Tensor) -> torch.Tensor:
    """s = -log(1 - r): Exp(1) under H0."""
    return -torch.log(one_minus_r)


class GumbelWatermark(KeyedSamplingWatermark):
    """``GumbelWatermark(spec, secret, vocab_size, key_id)``: the keyed race for generation and the
    per-position scores for detection, from one definition of r."""

    SPEC_TYPE = GumbelSpec
    SCHEME = "gumbel"  # the PRF's scheme tag: seeds are domain-separated from kgw's

    def one_minus_r(self, contexts: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """1 - r for [N, h] contexts and the whole vocabulary ([N, V]) or candidate ids ([N, C])."""
        words = keyed_words(self._seeds.seeds(contexts), candidates, self.vocab_size)
        return uniform_parts(words)[1]

    # ---- generation -------------------------------------------------------------------------------
    def choose(self, logits: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Token ids [B] for logits [B, V] (after every earlier stage, temperature included) whose rows'
        last h tokens are ``contexts`` [B, h]. Rows to sample unwatermarked (short history, a repeated
        context) are the caller's: this stage only runs on rows it watermarks."""
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits: expected width {self.vocab_size}, got {logits.shape[-1]}")
        seeds = self._seeds.seeds(contexts).to(logits.device)
        token_mix = vocab_mix_table(self.vocab_size, logits.device).unsqueeze(0)
        return kernels.call("gumbel", _race, logits, seeds, token_mix)

    def choose_from_probs(self, probs: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """Token ids [B] = argmax_v ``race_scores`` (log p_v + G_v, first index on ties) for
        probabilities ``probs`` [B, V] (after temperature and truncation), without a logarithm per token.

        Exact pruning: with E_v = -log r_v the winner minimises E_v / p_v, so once a reference token
        (each row's most likely) scores b = E_ref / p_ref, only tokens with E_v <= b p_v can win, and
        1 - r_v <= E_v makes 1 - r_v <= b p_v a necessary condition: one integer pass over [B, V],
        then the exact scores of the few (about b) survivors."""
        if probs.shape[-1] != self.vocab_size:
            raise ValueError(f"probs: expected width {self.vocab_size}, got {probs.shape[-1]}")
        seeds = self._seeds.seeds(contexts).to(probs.device)
        table = vocab_mix_table(self.vocab_size, probs.device)
        found = _survivors_backend(probs, seeds, table, PRUNE_SLACK) if _survivors_backend is not None else None
        rows, cols = found if found is not None else self._survivors(probs, seeds, table)
        minus = uniform_parts(fmix64(mix64(seeds[rows, 0], table[cols])))[1]
        scores = race_scores(probs[rows, cols], minus)
        best = torch.full((probs.shape[0],), float("-inf"), dtype=torch.float64, device=probs.device)
        best.scatter_reduce_(0, rows, scores, reduce="amax")
        first = torch.full((probs.shape[0],), self.vocab_size, dtype=torch.long, device=probs.device)
        winners = scores == best[rows]
        return first.scatter_reduce_(0, rows[winners], cols[winners], reduce="amin")

    def choose_among(self, probs: torch.Tensor, contexts: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """``choose_from_probs`` when only ``candidates`` [B, C] (ascending token ids) have p > 0 and
        ``probs`` [B, C] are theirs: the same race (the same r per token, ties to the smallest id)."""
        scores = race_scores(probs, self.one_minus_r(contexts, candidates).to(probs.device))
        return candidates.gather(1, scores.argmax(dim=-1, keepdim=True))[:, 0]

    @staticmethod
    def _survivors(probs: torch.Tensor, seeds: torch.Tensor, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, token ids) that can still win, row-major (the tensor code of ``choose_from_probs``)."""
        reference = probs.argmax(dim=-1, keepdim=True)
        ref_minus = uniform_parts(fmix64(mix64(seeds, table[reference])))[1]
        ref_score = race_scores(probs.gather(1, reference), ref_minus)  # [B, 1]
        bound = torch.exp(-ref_score) * (1.0 + PRUNE_SLACK)  # b = E_ref / p_ref, with slack
        keep = kernels.call("gumbel_candidates", _race_candidates, probs, seeds, table.unsqueeze(0), bound)
        return keep.nonzero(as_tuple=True)  # row-major: within a row, ascending token ids

    # ---- detection ------------------------------------------------------------------------------
    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores s = -log(1 - r) [T - h] (float64) and each position's unit [T - h, h + 1]."""
        units = ngram_units(token_ids, self.context_width)
        if units.shape[0] == 0:
            return torch.zeros(0, dtype=torch.float64), units
        rows = units.numpy()
        h = self.context_width
        words = keyed_word_values(self._seeds.seed_values(rows[:, :h]), rows[:, h], self.vocab_size)
        return exponential_scores(torch.from_numpy(one_minus_r_values(words))), units
