"""z-scores, p-values, thresholds and multiple-testing corrections."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from watermark import stats


def test_z_score_matches_the_formula_and_its_edges():
    assert stats.z_score(25, 100, 0.25) == 0.0
    assert stats.z_score(40, 100, 0.25) == pytest.approx(15 / math.sqrt(18.75))
    assert math.isnan(stats.z_score(0, 0, 0.25))


def test_p_values_normal_and_exact_binomial():
    assert stats.p_value_normal(4.0) == pytest.approx(3.167e-5, rel=1e-3)
    assert stats.p_value_normal(float("nan")) == 1.0
    # exact tail P(G >= 40) for Binomial(100, 0.25), summed by hand
    exact = sum(math.comb(100, k) * 0.25**k * 0.75 ** (100 - k) for k in range(40, 101))
    assert stats.p_value_binomial(40, 100, 0.25) == pytest.approx(exact, rel=1e-9)
    assert stats.p_value_binomial(0, 100, 0.25) == pytest.approx(1.0)
    assert stats.p_value_binomial(0, 0, 0.25) == 1.0


def test_threshold_for_a_false_positive_rate_inverts_the_tail():
    for fpr in (1e-2, 1e-3, 3.167e-5, 1e-9):
        z = stats.z_threshold_for_fpr(fpr)
        assert stats.p_value_normal(z) == pytest.approx(fpr, rel=1e-9)
    assert stats.z_threshold_for_fpr(3.167e-5) == pytest.approx(4.0, abs=1e-3)
    with pytest.raises(ValueError):
        stats.z_threshold_for_fpr(0.0)


def test_minimum_tokens_is_where_an_all_green_text_reaches_the_threshold():
    for z, gamma in ((4.0, 0.25), (4.0, 0.5), (3.0, 0.2)):
        t = stats.min_tokens_for_threshold(z, gamma)
        assert stats.z_score(t, t, gamma) >= z
        assert stats.z_score(t - 1, t - 1, gamma) < z


def test_bonferroni_and_holm():
    p = [0.01, 0.04, 0.03, 0.005]
    assert stats.bonferroni(p) == pytest.approx([0.04, 0.16, 0.12, 0.02])
    assert stats.bonferroni([0.5], tests=3) == [1.0]
    # Holm: sorted 0.005*4, 0.01*3, 0.03*2, 0.04*1 -> 0.02, 0.03, 0.06, 0.06 (monotone)
    assert stats.holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.z_for_p(sps.norm.sf(3.0)) == pytest.approx(3.0)


def test_z_for_p_is_scipys_normal_quantile_to_the_bit():
    """``z_for_p`` (the decision threshold, every detect-scope view's coarse z) takes ndtri directly: the same
    float as ``scipy.stats.norm.isf`` for every p, the tails, 0.5 (no -0.0) and the edges included."""
    rng = np.random.default_rng(11)
    ps = np.concatenate([rng.random(20_000), 10.0 ** -rng.uniform(0, 300, 20_000),
                         1.0 - 10.0 ** -rng.uniform(1, 16, 2_000),
                         [0.5, 5e-324, 2.2250738585072014e-308, 1e-300, 3.167124183311986e-05, 1e-3, 0.999999]])
    for p in ps:
        expected = float(sps.norm.isf(p))
        got = stats.z_for_p(float(p))
        assert got == expected and math.copysign(1.0, got) == math.copysign(1.0, expected), p
    assert stats.z_for_p(0.0) == math.inf and stats.z_for_p(1.0) == -math.inf
    assert stats.z_threshold_for_fpr(3.167124183311986e-05) == float(sps.norm.isf(3.167124183311986e-05))
