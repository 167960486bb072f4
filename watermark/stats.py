"""The statistics of green counts: z-scores, p-values, thresholds, multiple-testing corrections.

Under H0 (text written without the key) each scored, deduplicated position is green with
probability gamma independently, so the green count G of T positions is Binomial(T, gamma).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from watermark.field_error import FieldError

Z_THRESHOLD = 4.0  # default verdict threshold: one-sided normal p ~ 3.2e-5 (Kirchenbauer et al.)


def z_score(green: int | float, total: int | float, gamma: float) -> float:
    """(G - gamma T) / sqrt(T gamma (1 - gamma)); nan when nothing was scored."""
    if total <= 0:
        return float("nan")
    return (green - gamma * total) / math.sqrt(total * gamma * (1.0 - gamma))


# scipy.special's ufuncs, not scipy.stats' distribution objects: the same numbers (the regularised
# incomplete beta / the normal CDF) without ~80 us of argument handling per call on the detection path.
def p_value_normal(z: float) -> float:
    """One-sided P(Z >= z) under N(0, 1)."""
    if math.isnan(z):
        return 1.0
    return float(special.ndtr(-z))


def p_value_binomial(green: int, total: int, gamma: float) -> float:
    """Exact one-sided P(G' >= G) for G' ~ Binomial(T, gamma)."""
    if total <= 0:
        return 1.0
    return float(special.bdtrc(green - 1, total, gamma))


def binomial_sf(green: np.ndarray, total: np.ndarray, gamma: float) -> np.ndarray:
    """``p_value_binomial`` over arrays; 1 where total = 0."""
    total = np.asarray(total)
    out = np.asarray(special.bdtrc(np.asarray(green) - 1, np.maximum(total, 0), gamma), dtype=np.float64)
    return np.where(total > 0, out, 1.0)


def z_threshold_for_fpr(fpr: float) -> float:
    """The z whose one-sided normal tail is ``fpr``."""
    if not 0.0 < fpr < 1.0:
        raise FieldError("fpr", f"expected a probability strictly between 0 and 1, got {fpr!r}")
    return z_for_p(fpr)


def min_tokens_for_threshold(z_threshold: float, gamma: float) -> int:
    """Fewest scored positions at which an all-green text reaches ``z_threshold``.

    With every one of T positions green, z = sqrt(T (1 - gamma) / gamma); below this T no text
    can be called watermarked, so shorter texts are ``insufficient_text`` rather than negatives."""
    if z_threshold <= 0:
        return 1
    return max(1, math.ceil(z_threshold**2 * gamma / (1.0 - gamma) - 1e-12))


def bonferroni(p_values: Sequence[float], tests: int | None = None) -> list[float]:
    """Each p times the number of tests, capped at 1."""
    m = len(p_values) if tests is None else tests
    return [min(1.0, p * m) for p in p_values]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def z_for_p(p: float) -> float:
    """The one-sided normal z whose tail is p (inf for p = 0)."""
    if p <= 0.0:
        return float("inf")
    if p >= 1.0:
        return float("-inf")
    # scipy.stats.norm.isf(p) computes -ndtri(p) * scale + loc: the same float (0.0 - x turns -0.0 into 0.0 as
    # its + loc does) without its ~35 us of argument handling; every detect-scope view calls this three times
    return 0.0 - float(special.ndtri(p))
