"""What the sampling families share, in two shapes: a Gumbel-max race (``gumbel:``, ``vllm:gumbel``; per position
s = -log(1 - r), Exp(1) under H0, the Gamma tail of their sum) and a SynthID tournament (``synthid:``,
``hf:synthid``; per position m g-values, Bernoulli(null rate) under H0, the exact binomial tail).

Each shape says how a position is worth (``score_counted``, ``window_p_values``), what one watermarked position at
the reference distribution is worth (``reference_unit_z``: the verdict's ``min_tokens``), the verdict's
``statistic``, and how a token is chosen in generation (``choose``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from watermark.sampling_stats import (
    g_binomial_p_value,
    g_binomial_sf,
    g_z,
    gamma_p_value,
    gamma_sf,
    gamma_z,
    synthid_layer_weights,
)
from watermark.schemes.family import SchemeFamily

# The reference position for "how long must a watermarked text be": the model spreads its probability
# evenly over 4 tokens (2 bits), as KGW's min_tokens takes a best-case position (detector.scoring).
# Gumbel: E[s] there is the harmonic number H_4 = 25/12 (E[s] = sum_v p_v H(1/p_v), watermark/gumbel.py).
GUMBEL_REFERENCE_SCORE = 25.0 / 12.0
# SynthID: mean g over 30 layers of the winner of a tournament over 4 equally likely tokens; 0.5775 by a
# seeded simulation of the tournament (tests/test_detector_sampling.py recomputes it).
SYNTHID_REFERENCE_MEAN_G = 0.5775


@dataclass(frozen=True, slots=True)
class CountedScore:
    """The score of a text's (or a window's) counted positions under one key."""

    statistic: float  # Gumbel: sum of s; SynthID: number of g = 1 over units x layers
    z_score: float
    p_value: float  # exact
    mean_g: float = math.nan  # SynthID only
    weighted_mean_g: float = math.nan


class GumbelRace(SchemeFamily):
    """A Gumbel-max sampling family: the keyed race chooses the token."""

    sampling = True
    deterministic_choice = True  # a function of (context, distribution): siblings of one prompt are one text
    explanation_field = "score"

    def score_counted(self, mark, counted: np.ndarray) -> CountedScore:
        t = int(counted.shape[0])
        total = float(counted.sum()) if t else 0.0
        return CountedScore(total, gamma_z(total, t), gamma_p_value(total, t))

    def window_p_values(self, mark, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return gamma_sf(sums, counts)

    def reference_unit_z(self, mark) -> float:
        return GUMBEL_REFERENCE_SCORE - 1.0  # Exp(1) under H0: mean 1, sd 1

    def statistic(self, mark, score) -> dict:
        t = score.num_tokens_scored
        return {"name": "gumbel_sum", "sum": score.statistic, "mean": score.statistic / t if t else None}

    def choose(self, mark, probs, context, ids, generators, draw):
        return mark.choose_from_probs(probs.contiguous(), context) if ids is None else \
            mark.choose_among(probs, context, ids)


class Tournament(SchemeFamily):
    """A SynthID tournament family: the tournament's winner distribution, drawn with the rows' own generators."""

    sampling = True
    explanation_field = "g_values"

    def score_counted(self, mark, counted: np.ndarray) -> CountedScore:
        t = int(counted.shape[0])
        m, rate = mark.layers, mark.null_g_rate
        ones = int(counted.sum()) if t else 0
        mean = ones / (t * m) if t else math.nan
        weighted = float((counted * synthid_layer_weights(m)).sum() / (t * m)) if t else math.nan
        return CountedScore(float(ones), g_z(ones, t * m, rate), g_binomial_p_value(ones, t * m, rate), mean, weighted)

    def window_p_values(self, mark, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        return g_binomial_sf(np.rint(sums).astype(np.int64), counts * mark.layers, mark.null_g_rate)

    def reference_unit_z(self, mark) -> float:
        rate, m = mark.null_g_rate, mark.layers
        return (SYNTHID_REFERENCE_MEAN_G - rate) * m / math.sqrt(m * rate * (1.0 - rate))

    def statistic(self, mark, score) -> dict:
        return {"name": "g_values", "ones": int(score.statistic), "trials": score.num_tokens_scored * mark.layers,
                "null_rate": mark.null_g_rate, "mean_g": _finite(score.mean_g),
                "weighted_mean_g": _finite(score.weighted_mean_g)}

    def choose(self, mark, probs, context, ids, generators, draw):
        winner, played = mark.winner_distribution(probs, context, ids)
        got = draw(winner, generators)
        return got if played is None else played.gather(1, got[:, None])[:, 0]


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None
