"""The statistics of the sampling watermarks: exact p-values under H0 (text written without the key).

* Gumbel: each counted unit's score s = -log(1 - r) is Exp(1), independent across distinct units, so
  the sum S of T units is Gamma(T, 1): p = P(Gamma(T, 1) >= S) = Q(T, S), the regularised upper
  incomplete gamma function (``scipy.special.gammaincc``). z-like score: (S - T) / sqrt(T).
* SynthID: each counted unit's m g-values are Bernoulli(q) (q = 1/2 for our keyed bits, the table's
  fraction of ones for hf:synthid), so the count K of ones among T m is Binomial(T m, q): exact p.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from watermark.stats import binomial_sf as g_binomial_sf  # noqa: F401  (K ones of T m trials: the same tail)
from watermark.stats import p_value_binomial as g_binomial_p_value  # noqa: F401


def gamma_p_value(score_sum: float, count: int) -> float:
    """P(Gamma(count, 1) >= score_sum); 1 when nothing was counted."""
    if count <= 0:
        return 1.0
    return float(special.gammaincc(count, max(score_sum, 0.0)))


def gamma_sf(score_sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``gamma_p_value`` over arrays."""
    counts = np.asarray(counts, dtype=np.float64)
    out = special.gammaincc(np.maximum(counts, 1.0), np.maximum(np.asarray(score_sums, dtype=np.float64), 0.0))
    return np.where(counts > 0, out, 1.0)


def gamma_z(score_sum: float, count: int) -> float:
    """(S - T) / sqrt(T): a Gamma(T, 1) sum standardised; nan when nothing was counted."""
    if count <= 0:
        return float("nan")
    return (score_sum - count) / math.sqrt(count)




def g_z(ones: float, trials: float, rate: float) -> float:
    if trials <= 0:
        return float("nan")
    return (ones - rate * trials) / math.sqrt(trials * rate * (1.0 - rate))


def synthid_layer_weights(layers: int) -> np.ndarray:
    """SynthID's weighted-mean weights: linear from 10 (first layer) to 1 (last), scaled to sum to m
    (``synthid_text.detector_mean.weighted_mean_score``): earlier layers carry more signal."""
    weights = np.linspace(10.0, 1.0, layers)
    return weights * layers / weights.sum()
