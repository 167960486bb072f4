"""A spoof check for positive verdicts (KGW, gumbel:, synthid:): is the text's watermark evidence
concentrated on the units a thief could have learnt from the service's own watermarked output?

A watermark thief (Jovanovic et al., ICML 2024) estimates each unit's colour from watermarked text it
read, so it knows the colours of units that recur in the service's output and not those of rare ones;
text it steers or edits with them is green where it knew, at the base rate gamma elsewhere. Gloaguen
et al. (ICML 2025) show this artefact in every learning-based spoofer. The service knows what it
emitted: ``OutputCounts`` holds, per key, in how many of its watermarked outputs each unit occurred
(key-free unit identities, ``watermark.units``; no text). A unit's learnability is x = log(count + 1/2).

Statistic (one text, its counted units i = 1..n, unit scores y_i): S = sum_i y_i (x_i - mean x). If the
scores did not depend on x, S given the multiset of scores would have mean 0 and variance
Syy Sxx / (n - 1), Syy = sum_i (y_i - mean y)^2, Sxx = sum_i (x_i - mean x)^2 (a permutation statistic);
``z = S / sd``. A unit's score is what the detector sums for it (``unit_scores``): KGW its green flag (0/1;
then Syy = G (n - G) / n with G greens), gumbel: s = -log(1 - r) (Exp(1) under H0), synthid: its number of
g = 1 layers. The counted units are exactly the detector's: first occurrences under dedup, units common in
human text left out (``detector.common_units``). Genuine output does depend a little on x (the watermark
makes its high-scoring units recur in the output), so the null is the service's own outputs, each scored
against the counts without itself (``SpoofNull``): a verdict's spoof p-value is the fraction of those with
a z at least as large. docs/security.md has the measurements (human-text frequency instead of the
service's counts was measured too weak to use).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from db.count_table import as_int64
from db.output_memory import NullSample
from detector.common_units import CommonUnits
from detector.scoring import score_positions
from detector.scoring_sampling import positions
from watermark.schemes import FAMILIES, family_of

MIN_UNITS = 16  # fewer counted units: no spoof check (the permutation variance is too coarse)
MIN_NULL = 100  # the key's own outputs (past db.output_memory.WARMUP) needed before a spoof p-value is given
SPOOF_ALPHA = 1e-3  # spoof_suspected when the normal-fit p-value is at most this
# Which specs have the check is their family's (``SchemeFamily.spoof_check``: keyring keys scored with the
# common-unit table; hf:, hf:synthid, vllm:gumbel have none), and which have measured power (``spoof_judged``,
# docs/security.md): gumbel's genuine output recurs on its own highest-scoring units, so its null sits above the
# spoofs' z; its z is reported, ``suspected`` stays None.


def has_check(spec) -> bool:
    """Whether verdicts under ``spec`` get the spoof check (its family's ``spoof_check``)."""
    return family_of(spec).spoof_check


def _refuse_unchecked(mark) -> None:
    if not has_check(mark.spec):
        raise ValueError(f"the spoof check takes specs of {', '.join(f.name for f in FAMILIES if f.spoof_check)}, "
                         f"not {mark.spec.format()!r}")
FLAT = 1e-12  # a sum of squares below this share of its raw sum is rounding: every value equal


@dataclass(frozen=True, slots=True)
class SpoofCheck:
    units: int
    z: float

    def to_dict(self) -> dict:
        return {"units": self.units, "z": self.z if math.isfinite(self.z) else None}


class OutputCounts:
    """Unit identity -> number of the key's watermarked outputs that contain it (each output counts a unit once)."""

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.outputs = 0

    def add(self, identities: np.ndarray) -> None:
        for unit in np.unique(identities).tolist():
            self._counts[unit] = self._counts.get(unit, 0) + 1
        self.outputs += 1

    def of(self, identities: np.ndarray, without: np.ndarray | None = None) -> np.ndarray:
        """Counts of ``identities``; ``without``: one output already added, taken out again (leave-one-out)."""
        get = self._counts.get
        found = np.fromiter((get(u, 0) for u in identities.tolist()), dtype=np.float64, count=identities.shape[0])
        if without is not None:
            found -= np.isin(identities, without)
        return found


def spoof_check(mark, token_ids, common: CommonUnits, counts: OutputCounts, leave_out: bool = False,
                without: np.ndarray | None = None) -> SpoofCheck | None:
    """The check on one text under one key (None for specs without it, ``has_check``, or too few counted
    units). ``leave_out``: the text is one of the outputs in ``counts``; score it as if it were not.
    ``without``: the unit identities of one output in ``counts`` that the text repeats (an edited copy of
    it, ``db.output_grams``), taken out of the counts as a verdict does."""
    if not has_check(mark.spec):
        return None
    scores, counted, identities = counted_units(mark, token_ids, common)
    if scores.shape[0] < MIN_UNITS:
        return None
    if leave_out:
        seen = counts.of(identities, identities)[counted]
    elif without is not None:
        seen = counts.of(identities[counted], without)
    else:  # only the counted units are looked up (the shared memory is a database)
        seen = counts.of(identities[counted])
    return spoof_statistic(scores, np.log(seen + 0.5))


def counted_units(mark, token_ids, common: CommonUnits | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(The scores y of the units the detector counts, in position order; which scored positions those are
    [T - h]; every scored position's key-free unit identity [T - h]), from the detector's own scoring:
    dedup, units common in human text left out. The generation side names its output's units with the
    same identities (``output_null_z``), so the counts it writes are the counts a verdict reads."""
    values, identities, prev = scored_units(mark, token_ids, common)
    counted = prev < 0
    return unit_scores(values[counted]), counted, identities


def scored_units(mark, token_ids, common: CommonUnits | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Every scored position's values as the detector scores them: KGW green flags [N], gumbel s [N], synthid
    g-values [N, m]; its key-free unit identity [N]; its previous occurrence under dedup with the common units
    left out [N], < 0 for the units that count): the check's input, as a verdict's own scoring pass has it."""
    _refuse_unchecked(mark)
    if family_of(mark.spec).green_list:
        flags, prev, identities = score_positions(mark, token_ids, common, dedup=True, with_identities=True)
        return flags, identities, prev
    values, prev, identities = positions(mark, token_ids, True, common, with_identities=True)
    return values, identities, prev


def unit_scores(values: np.ndarray) -> np.ndarray:
    """A unit's score, what the detector's statistic sums for it: KGW's green flag [n], gumbel's s = -log(1 - r)
    [n], or synthid's number of g = 1 layers from its g-values [n, m] (the mean g up to the constant m)."""
    if values.ndim == 2:
        return values.sum(axis=1, dtype=np.float64)
    return np.asarray(values, dtype=np.float64)


def spoof_statistic(scores: np.ndarray, learnability: np.ndarray) -> SpoofCheck:
    """The permutation z of sum y (x - mean x) for unit scores y (0/1 green flags, or continuous) and
    learnabilities x: variance Syy Sxx / (n - 1), see the module docstring; NaN when y or x is constant."""
    y = np.asarray(scores, dtype=np.float64)
    x = np.asarray(learnability, dtype=np.float64)
    if y.ndim != 1 or y.shape != x.shape:
        raise ValueError(f"scores and learnability: expected two vectors of one length, got {y.shape} and {x.shape}")
    n = y.shape[0]
    if n < 2:
        return SpoofCheck(n, float("nan"))
    centred = x - x.sum() / n
    centred_y = y - y.sum() / n
    return statistic_of_sums(n, float(centred @ centred), float(centred_y @ centred_y), float(y @ centred),
                             float(x @ x), float(y @ y))


def statistic_of_sums(n: int, spread_x: float, spread_y: float, sum_xy: float, raw_x: float, raw_y: float) -> SpoofCheck:
    """The permutation z from its sums: Sxx, Syy about the means, sum y (x - mean x), sum x^2, sum y^2 (NaN
    when y or x is constant, or n < 2)."""
    if n < 2 or spread_x <= FLAT * raw_x or spread_y <= FLAT * raw_y:
        return SpoofCheck(n, float("nan"))
    return SpoofCheck(n, sum_xy / math.sqrt(spread_y * spread_x / (n - 1)))


class StoredCounts:
    """``OutputCounts.of`` for one key, read from the service's shared memory (``db.output_memory``)."""

    def __init__(self, memory, key_id: str) -> None:
        self.memory, self.key_id = memory, key_id

    def of(self, identities: np.ndarray, without: np.ndarray | None = None) -> np.ndarray:
        found = self.memory.counts_of(self.key_id, identities)
        if without is not None:
            found -= np.isin(identities, without)
        return found


def output_null_z(mark, token_ids, common: CommonUnits, memory) -> tuple[float | None, np.ndarray]:
    """(The spoof z of one of the service's own outputs against the counts before it: its null sample, None
    when it has too few counted units; its unit identities, for the counts it adds), from one scoring pass.
    ValueError for a spec without the check (``has_check``)."""
    _refuse_unchecked(mark)
    scores, counted, identities = counted_units(mark, token_ids, common)
    if scores.shape[0] < MIN_UNITS:
        return None, identities
    seen = memory.counts_of(mark.key_id, identities[counted])
    z = spoof_statistic(scores, np.log(seen + 0.5)).z
    return (z if math.isfinite(z) else None), identities


def verdict_spoof_check(mark, units: tuple[np.ndarray, np.ndarray, np.ndarray], memory,
                        without: np.ndarray | None = None) -> dict | None:
    """What a ``watermarked`` verdict reports: the text's spoof z, its p-value under the key's own outputs
    (normal fit, and the empirical tail), ``suspected`` (p <= SPOOF_ALPHA), the null's size. ``suspected``
    is None while the key's null has fewer than MIN_NULL outputs, and for a kind without measured power
    (gumbel: not ``spoof_judged``: a false bit would read as an assurance); None (and nothing looked up)
    when the spec has no check (``has_check``), or the text fewer than MIN_UNITS counted units.

    ``units``: (values, identities, previous occurrences) of every scored position as the verdict's own
    scoring pass found them (``scored_units`` gives the same from the token ids); ``memory``: the key's memory
    as this process holds it (``db.output_memory.MemoryMirror.view``: its count table and null, no query).
    ``without``: the unit identities of one remembered output the text repeats (``db.output_grams``), left
    out of the counts as each output of the null was scored without itself."""
    if not has_check(mark.spec):
        return None
    values, identities, prev = units
    if without is None:
        check = statistic_of_sums(*memory.table.spoof_sums(identities, unit_scores(values), prev))
    else:
        counted = identities[prev < 0]
        seen = memory.table.counts(counted) - np.isin(as_int64(counted), as_int64(without))
        check = spoof_statistic(unit_scores(values[prev < 0]), np.log(np.maximum(seen, 0.0) + 0.5))
    if check.units < MIN_UNITS or not math.isfinite(check.z):
        return None
    null = SpoofNull.of(memory.null)
    size = int(null.z.shape[0])
    if size < MIN_NULL:
        return {"z": round(check.z, 4), "units": check.units, "null_outputs": size, "p_value": None,
                "p_value_empirical": None, "suspected": None}
    p_normal = null.p_value_normal(check.z)
    judged = family_of(mark.spec).spoof_judged
    return {"z": round(check.z, 4), "units": check.units, "null_outputs": size, "p_value": p_normal,
            "p_value_empirical": null.p_value(check.z), "suspected": bool(p_normal <= SPOOF_ALPHA) if judged else None}


class SpoofNull:
    """The null of the spoof z: the key's own outputs, each against the counts without itself."""

    def __init__(self, z_values) -> None:
        sample = NullSample.of(np.asarray(z_values, dtype=np.float64))  # None becomes NaN, dropped
        self.z, self._mean, self._sd = sample.z, sample.mean, sample.sd

    @classmethod
    def of(cls, sample: NullSample) -> SpoofNull:
        """The null of an already sorted sample with its moments (a detector worker's copy keeps one)."""
        null = cls.__new__(cls)
        null.z, null._mean, null._sd = sample.z, sample.mean, sample.sd
        return null

    def p_value(self, z: float) -> float:
        """(1 + #{null z >= z}) / (1 + n): the conservative empirical p-value."""
        if not math.isfinite(z):
            return 1.0
        at_least = self.z.shape[0] - bisect.bisect_left(self.z, z)  # numpy's searchsorted costs more on one value
        return float((1 + at_least) / (1 + self.z.shape[0]))

    def p_value_normal(self, z: float) -> float:
        """P(Z' >= z) for Z' normal with the null's mean and sd: reaches below 1 / n, but its tail is a
        model, not a measurement (check it against a larger null before trusting it there)."""
        if not math.isfinite(z) or self.z.shape[0] < 3 or not self._sd > 0.0:
            return 1.0
        return 0.5 * math.erfc((z - self._mean) / (self._sd * math.sqrt(2.0)))  # scipy's norm.sf, without its overhead
