"""The spoof check's statistic (detector.spoof_check): calibrated when greens (or continuous unit scores)
ignore learnability, large when they follow it, the same formula for both, and its null's p-values
conservative."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.spoof_check import OutputCounts, SpoofNull, spoof_statistic


def test_greens_on_learnable_units_give_a_large_z():
    rng = np.random.default_rng(1)
    z = []
    for _ in range(200):  # 200 spoofed texts of 200 units: green where the thief knew, gamma elsewhere
        x = np.log(rng.integers(0, 50, size=200) + 0.5)
        learnt = x > np.median(x)
        z.append(spoof_statistic(np.where(learnt, rng.random(200) < 0.8, rng.random(200) < 0.25), x).z)
    assert np.mean(np.array(z) > 2.326) > 0.95  # the one-sided 1 % normal quantile


def test_binary_scores_give_the_green_count_variance_exactly():
    rng = np.random.default_rng(2)
    for n, gamma in ((16, 0.25), (150, 0.3), (400, 0.9)):
        x = np.log(rng.integers(0, 50, size=n) + 0.5)
        green = rng.random(n) < gamma
        g, centred = float(green.sum()), x - x.mean()
        # the KGW form the check shipped with: G (n - G) / (n (n - 1)) * Sxx
        z_kgw = float((green * centred).sum() / math.sqrt(g * (n - g) / (n * (n - 1)) * (centred ** 2).sum()))
        assert spoof_statistic(green, x).z == pytest.approx(z_kgw, rel=1e-12)
        assert spoof_statistic(green.astype(np.float64), x).z == pytest.approx(z_kgw, rel=1e-12)


@pytest.mark.parametrize("draw", [lambda rng, n: rng.random(n) < 0.3,  # kgw: green flags
                                  lambda rng, n: rng.exponential(size=n),  # gumbel: s ~ Exp(1) under H0
                                  lambda rng, n: rng.binomial(30, 0.5, size=n).astype(np.float64)],  # synthid
                         ids=["kgw", "gumbel", "synthid"])
def test_the_permutation_z_is_standard_normal_when_scores_ignore_learnability(draw):
    rng = np.random.default_rng(3)
    x = np.log(rng.integers(0, 50, size=150) + 0.5)
    trials = 4000
    z = np.array([spoof_statistic(draw(rng, 150), x).z for _ in range(trials)])
    assert abs(z.mean()) < 5 / math.sqrt(trials)
    assert abs(z.std() - 1) < 5 / math.sqrt(2 * trials)
    # the normal's 1 % tail, 5 binomial standard errors (Exp(1) scores are skewed: the permutation CLT still holds)
    assert np.mean(z >= 2.326) < 0.01 + 5 * math.sqrt(0.01 * 0.99 / trials)


def test_high_scores_on_learnable_units_give_a_large_z():
    rng = np.random.default_rng(4)
    z = []
    for _ in range(200):  # a gumbel spoof: units the thief knew score about 2.5, the others Exp(1)
        x = np.log(rng.integers(0, 50, size=200) + 0.5)
        learnt = x > np.median(x)
        z.append(spoof_statistic(np.where(learnt, 1.5 + rng.exponential(size=200), rng.exponential(size=200)), x).z)
    assert np.mean(np.array(z) > 2.326) > 0.95


def test_constant_scores_or_learnabilities_have_no_z_and_bad_shapes_are_refused():
    x = np.log(np.arange(20) + 0.5)
    assert math.isnan(spoof_statistic(np.full(20, 0.1), x).z)  # 0.1 is not exact in binary: no rounding z
    assert math.isnan(spoof_statistic(np.arange(20.0), np.full(20, math.log(2.5))).z)
    assert math.isnan(spoof_statistic(np.ones(1), np.ones(1)).z)
    with pytest.raises(ValueError, match="one length"):
        spoof_statistic(np.ones(3), np.ones(4))


def test_counts_leave_one_output_out_exactly():
    counts = OutputCounts()
    a, b = np.array([1, 2, 2, 3], dtype=np.uint64), np.array([2, 3, 4], dtype=np.uint64)
    counts.add(a)
    counts.add(b)
    assert counts.outputs == 2
    assert counts.of(np.array([1, 2, 3, 4, 5], dtype=np.uint64)).tolist() == [1, 2, 2, 1, 0]
    assert counts.of(np.array([2, 3, 4], dtype=np.uint64), without=b).tolist() == [1, 1, 0]


def test_the_null_p_value_is_conservative():
    null = SpoofNull([0.0, 1.0, 2.0, float("nan"), None])
    assert null.z.tolist() == [0.0, 1.0, 2.0]
    assert null.p_value(2.0) == pytest.approx(2 / 4) and null.p_value(5.0) == pytest.approx(1 / 4)
    assert null.p_value(float("nan")) == 1.0
    assert null.p_value_normal(10.0) < 1e-6 < null.p_value_normal(1.0)
