"""Scoring token ids against the sampling watermarks (Gumbel, SynthID, hf:synthid, vllm:gumbel).

Per position a value (Gumbel: s = -log(1 - r); SynthID: the number of layers with g = 1) and a dedup
unit; each distinct unit counts once (the first occurrence), so under H0 the counted values are
independent and the whole-text tests of ``watermark.sampling_stats`` are exact. Windows (WinMax, as
for KGW: sizes 32, 64, ... every size/8) and several keys (Holm) work as in ``detector.scoring``.
Units common in human text (``detector.common_units``) are left out for our keyed specs, as for KGW:
under a fixed key they would shift the null of every human text that shares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from detector.common_units import CommonUnits
from detector.row_order import previous_and_order
from detector.windows import window_sizes, window_starts
from watermark.schemes import family_of
from watermark.stats import holm
from watermark.units import identities as unit_identities


@dataclass(slots=True)
class SamplingScore:
    """The whole-text (or one window's) score under one key."""

    key_id: str | None
    num_tokens_scored: int
    statistic: float  # Gumbel: sum of -log(1 - r); SynthID: number of g = 1 over units x layers
    z_score: float
    p_value: float  # exact (Gamma or binomial)
    mean_g: float = float("nan")  # SynthID only
    weighted_mean_g: float = float("nan")  # SynthID only
    p_value_corrected: float = float("nan")  # Holm across keys (whole text) or x windows (window)
    start: int = 0  # scored-position range (windows)
    end: int = 0

    def to_dict(self) -> dict:
        finite = _finite_or_none
        return {"key_id": self.key_id, "num_tokens_scored": self.num_tokens_scored,
                "statistic": finite(self.statistic), "z_score": finite(self.z_score), "p_value": self.p_value,
                "mean_g": finite(self.mean_g), "weighted_mean_g": finite(self.weighted_mean_g),
                "p_value_corrected": finite(self.p_value_corrected), "start": self.start, "end": self.end}


@dataclass(slots=True)
class SampledPositions:
    """One key's scored positions of a text (index i is scored position i): what a sampling verdict reads."""

    values: np.ndarray  # float64 [N] (Gumbel) or uint8 [N, m] g-values (SynthID)
    prev: np.ndarray  # previous occurrence of the position's unit; itself: counts nowhere; -1: counted
    units: np.ndarray  # [N, h + 1] the dedup units (the dither's input)
    order: np.ndarray | None  # the units' sorted order (None without dedup)
    identities: np.ndarray | None  # key-free unit identities, when asked


def sampled_positions(mark, token_ids, dedup: bool = True, common: CommonUnits | None = None,
                      with_identities: bool = False) -> SampledPositions:
    """``positions`` with units, as one named value."""
    found = positions(mark, token_ids, dedup, common, with_units=True, with_identities=with_identities)
    return SampledPositions(*found[:4], found[4] if with_identities else None)


def positions(mark, token_ids, dedup: bool = True, common: CommonUnits | None = None,
              with_units: bool = False, with_identities: bool = False) -> tuple[np.ndarray, ...]:
    """Per scored position: values [N] (float64 for Gumbel; [N, m] uint8 g-values for SynthID) and
    the previous occurrence of its unit [N] (-1 for a first occurrence; all -1 without dedup). With a
    ``common`` table (gumbel: and synthid: specs) a position whose unit is common in human text points
    at itself: it counts nowhere, in the text or in a window (``detector.common_units``). With
    ``with_units`` also each position's unit [N, h + 1] and the units' sorted order (``detector.row_order``;
    None without dedup), which the dither reuses; with ``with_identities`` last each unit's key-free identity
    [N] (``sampling_identities``; the common-unit table looks them up anyway)."""
    values, units = mark.scored_positions(token_ids)
    units = units.numpy()
    if dedup:
        prev, order = previous_and_order(units)
    else:
        prev, order = np.full(units.shape[0], -1, dtype=np.int64), None
    identities = None
    if (common is not None and units.shape[0]) or with_identities:
        identities = sampling_identities(units)
    if common is not None and units.shape[0]:
        excluded = common.excluded(mark, token_ids, identities)
        prev[excluded] = excluded
    return ((values.numpy(), prev) + ((units, order) if with_units else ())
            + ((identities,) if with_identities else ()))


def sampling_identities(units: np.ndarray) -> np.ndarray:
    """The key-free identity of each sampling unit [N, h + 1] (context then token: the (h+1)-gram, as
    lefthash's; ``watermark.units``): what the common-unit table and the spoof check's counts name it by."""
    return unit_identities("lefthash", units, None)


def counted_score(mark, values: np.ndarray, prev: np.ndarray) -> SamplingScore:
    """The score of the positions that count (first occurrences; ``prev`` < 0) of precomputed values."""
    return _score(mark, values[prev < 0], mark.key_id)


def score_text(mark, token_ids, dedup: bool = True, common: CommonUnits | None = None) -> SamplingScore:
    """The whole-text score of ``token_ids`` under ``mark`` (a sampling watermark)."""
    values, prev = positions(mark, token_ids, dedup, common)
    counted = prev < 0
    return _score(mark, values[counted], mark.key_id)


def score_keys(marks: list, token_ids, dedup: bool = True,
               common: CommonUnits | None = None) -> tuple[SamplingScore, list[SamplingScore]]:
    """Each key's whole-text score with Holm-adjusted p-values; returns (best, all)."""
    if not marks:
        raise ValueError("marks: expected at least one watermark")
    scores = [score_text(m, token_ids, dedup, common) for m in marks]
    for score, p in zip(scores, holm([s.p_value for s in scores])):
        score.p_value_corrected = p
    return min(scores, key=lambda s: (s.p_value, -np.nan_to_num(s.z_score, nan=-np.inf))), scores


def best_window(mark, token_ids, dedup: bool = True, tests_other_keys: int = 1,
                common: CommonUnits | None = None) -> SamplingScore | None:
    """The window with the smallest exact p (each window counts a unit once inside it), Bonferroni-
    corrected by the number of windows times ``tests_other_keys``; None for texts under 2 x 32 units."""
    values, prev = positions(mark, token_ids, dedup, common)
    return window_of(mark, values, prev, tests_other_keys)


def window_of(mark, values: np.ndarray, prev: np.ndarray, tests_other_keys: int = 1) -> SamplingScore | None:
    """``best_window`` over precomputed ``positions`` (positions left out point at themselves)."""
    n = values.shape[0]
    per_position = values.sum(axis=1).astype(np.float64) if values.ndim == 2 else values
    best, windows = None, 0
    family = family_of(mark.spec)
    for size in window_sizes(n):
        starts = window_starts(n, size)
        windows += len(starts)
        counts, sums = _window_sums(per_position, prev, size)
        counts, sums = counts[starts], sums[starts]
        p = family.window_p_values(mark, sums, counts)
        i = int(np.argmin(p))
        if best is None or p[i] < best[0]:
            best = (float(p[i]), size, int(starts[i]))
    if best is None:
        return None
    p, size, start = best
    window = _window_values(values, prev, start, start + size)
    score = _score(mark, window, mark.key_id)
    score.start, score.end = start, start + size
    score.p_value_corrected = min(1.0, score.p_value * windows * max(1, tests_other_keys))
    return score


def _window_values(values: np.ndarray, prev: np.ndarray, start: int, end: int) -> np.ndarray:
    """Values counted inside [start, end): positions whose previous occurrence lies before start."""
    index = np.arange(start, end)
    return values[index[prev[start:end] < start]]


def _window_sums(values: np.ndarray, prev: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(count, sum) of the counted values of every window [a, a + size): position i counts for the
    starts a in [max(prev[i] + 1, i - size + 1, 0), i] (a difference array, as detector.windows)."""
    n = values.shape[0]
    index = np.arange(n, dtype=np.int64)
    low = np.maximum(np.maximum(index - size + 1, 0), prev + 1)
    counts = np.cumsum(np.bincount(low, minlength=n + 1) - np.bincount(index + 1, minlength=n + 1))[:n]
    sums = np.cumsum(np.bincount(low, weights=values, minlength=n + 1)
                     - np.bincount(index + 1, weights=values, minlength=n + 1))[:n]
    count = n - size + 1
    return counts[:count], sums[:count]


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _score(mark, counted: np.ndarray, key_id) -> SamplingScore:
    """The score of counted values, as the mark's family scores a position (``watermark.schemes.sampling``)."""
    family = family_of(mark.spec)
    if not family.sampling:
        raise ValueError(f"not a sampling watermark: {mark.spec.format()!r}")
    found = family.score_counted(mark, counted)
    return SamplingScore(key_id, int(counted.shape[0]), found.statistic, found.z_score, found.p_value,
                         mean_g=found.mean_g, weighted_mean_g=found.weighted_mean_g)
