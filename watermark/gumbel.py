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
from watermark.keyed_words import ContextSeeds, fmix64, keyed_words, uniform_parts
from watermark.prf import mix64, vocab_mix_table
from watermark.sampling_common import ngram_units
from watermark.sampling_specs import GumbelSpec, parse_sampling_spec, sampling_fingerprint


def gumbel_noise(one_minus_r: torch.Tensor) -> torch.Tensor:
    """G = -log(-log r) in float64, from 1 - r (precise for r near 1 and near 0)."""
    return -torch.log(-torch.log1p(-one_minus_r))


def gumbel_argmax(logits: torch.Tensor, one_minus_r: torch.Tensor) -> torch.Tensor:
    """The Gumbel-max choice per row: argmax_v log(r_v) / p_v for p = softmax(logits) [B, V] -> [B]."""
    return torch.argmax(logits.to(torch.float64) + gumbel_noise(one_minus_r), dim=-1)


def _race(logits: torch.Tensor, seeds: torch.Tensor, token_mix: torch.Tensor) -> torch.Tensor:
    """keyed words -> 1 - r -> Gumbel noise -> argmax, one expression (fused by torch.compile)."""
    return gumbel_argmax(logits, uniform_parts(fmix64(mix64(seeds, token_mix)))[1])


def exponential_scores(one_minus_r: torch.Tensor) -> torch.Tensor:
    """s = -log(1 - r): Exp(1) under H0."""
    return -torch.log(one_minus_r)


class GumbelWatermark:
    """``GumbelWatermark(spec, secret, vocab_size, key_id)``: the keyed race for generation and the
    per-position scores for detection, from one definition of r."""

    SCHEME = "gumbel"  # the PRF's scheme tag: seeds are domain-separated from kgw's

    def __init__(self, spec: GumbelSpec | str, secret: bytes, vocab_size: int, key_id: str | None = None) -> None:
        self.spec = parse_sampling_spec(spec) if isinstance(spec, str) else spec
        if not isinstance(self.spec, GumbelSpec):
            raise ValueError(f"GumbelWatermark needs a gumbel: spec, got {self.spec.format()!r}")
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        if not secret:
            raise ValueError("a gumbel watermark needs a key: create one with `provmark keys create`")
        self.vocab_size = vocab_size
        self.key_id = key_id
        self.fingerprint = sampling_fingerprint(self.spec, vocab_size)
        self._seeds = ContextSeeds(bytes(secret), self.spec.prf, self.SCHEME)

    def __repr__(self) -> str:
        return f"GumbelWatermark({self.spec.format()!r}, key_id={self.key_id!r}, V={self.vocab_size})"

    @property
    def context_width(self) -> int:
        return self.spec.context_width

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

    # ---- detection ------------------------------------------------------------------------------
    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores s = -log(1 - r) [T - h] (float64) and each position's unit [T - h, h + 1]."""
        units = ngram_units(token_ids, self.context_width)
        if units.shape[0] == 0:
            return torch.zeros(0, dtype=torch.float64), units
        h = self.context_width
        one_minus = self.one_minus_r(units[:, :h], units[:, h:])
        return exponential_scores(one_minus)[:, 0], units
