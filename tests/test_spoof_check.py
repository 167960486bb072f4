"""The spoof check's statistic (detector.spoof_check): calibrated when greens ignore learnability, large
when they follow it, and its null's p-values conservative."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detector.spoof_check import OutputCounts, SpoofNull, spoof_statistic


def test_the_permutation_z_is_standard_normal_when_greens_ignore_learnability():
    rng = np.random.default_rng(0)
    x = np.log(rng.integers(0, 50, size=150) + 0.5)  # one text's units, fixed
    trials = 4000
    z = np.array([spoof_statistic(rng.random(150) < 0.3, x).z for _ in range(trials)])
    # mean and sd of 4000 draws of N(0, 1): 5 standard errors
    assert abs(z.mean()) < 5 / math.sqrt(trials)
    assert abs(z.std() - 1) < 5 / math.sqrt(2 * trials)
    assert np.mean(z >= 2.326) < 0.01 + 5 * math.sqrt(0.01 * 0.99 / trials)


def test_greens_on_learnable_units_give_a_large_z():
    rng = np.random.default_rng(1)
    z = []
    for _ in range(200):  # 200 spoofed texts of 200 units: green where the thief knew, gamma elsewhere
        x = np.log(rng.integers(0, 50, size=200) + 0.5)
        learnt = x > np.median(x)
        z.append(spoof_statistic(np.where(learnt, rng.random(200) < 0.8, rng.random(200) < 0.25), x).z)
    assert np.mean(np.array(z) > 2.326) > 0.95  # the one-sided 1 % normal quantile


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
