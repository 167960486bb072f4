"""Scoring token ids against watermarks: green flags, n-gram dedup, z / p, several keys at once.

Under H0 (text written without the key) each scored position's flag is green with probability
gamma, independently for distinct PRF inputs. A repeated (h+1)-gram repeats its flag, so with
dedup on (the default) every distinct n-gram counts once, as transformers' WatermarkDetector does
with ``ignore_repeated_ngrams=True``: T = distinct n-grams scored, G = distinct green n-grams, and
G ~ Binomial(T, gamma) under H0. Without dedup a repeated human sentence that happens to be
mostly green inflates z by the square root of its repeat count.

The verdict is an exact test: the one-sided binomial p-value (Holm-corrected when several keys
are tested) is compared with alpha, the false-positive rate; a z threshold is turned into
alpha = P(N(0,1) >= z) (z = 4.0: alpha ~ 3.2e-5).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from detector.common_units import CommonUnits
from detector.row_order import previous_and_order
from detector.scoring_kernel import kgw_scores
from watermark.config import WatermarkSpec
from watermark.field_error import FieldError
from watermark.scheme import Watermark
from watermark.stats import (
    Z_THRESHOLD,
    holm,
    min_tokens_for_threshold,
    p_value_binomial,
    p_value_normal,
    z_for_p,
    z_score,
    z_threshold_for_fpr,
)

WATERMARKED, NOT_WATERMARKED, INSUFFICIENT_TEXT = "watermarked", "not_watermarked", "insufficient_text"
CORRECTION = "holm"  # across keys; min Holm-adjusted p = keys * min p (Bonferroni for the best key)
# With windows on, the whole text and the window family share alpha half and half (Bonferroni over
# the two), so asking for windows never raises the false-positive rate above alpha.
WINDOW_ALPHA_SHARE = 0.5


@dataclass(slots=True)
class Decision:
    """What the verdict is decided against: alpha and the length below which no negative is given."""

    alpha: float  # one-sided false-positive rate of the whole decision
    z_threshold: float  # the z whose normal tail is alpha (as asked, or derived from fpr)

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, float) and 0.0 < self.alpha < 1.0):
            raise FieldError("fpr", f"expected a probability strictly between 0 and 1, got {self.alpha!r}")

    @classmethod
    def make(cls, z_threshold: float | None = Z_THRESHOLD, fpr: float | None = None) -> Decision:
        """From a target false-positive rate ``fpr`` (wins when given) or a z threshold."""
        if fpr is not None:
            if isinstance(fpr, bool) or not isinstance(fpr, (int, float)):
                raise FieldError("fpr", f"expected a number, got {fpr!r}")
            return cls(float(fpr), z_threshold_for_fpr(float(fpr)))
        if isinstance(z_threshold, bool) or not isinstance(z_threshold, (int, float)) or not math.isfinite(z_threshold):
            raise FieldError("z_threshold", f"expected a finite number, got {z_threshold!r}")
        if z_threshold <= 0:
            raise FieldError("z_threshold", f"expected a positive number, got {z_threshold!r}")
        return cls(p_value_normal(float(z_threshold)), float(z_threshold))


# ------------------------------------------------------------------------------- per position


def green_flags(wm: Watermark, token_ids: torch.Tensor) -> np.ndarray:
    """Bool [T - h]: the scheme's green flag of every scorable position (token i >= h)."""
    return wm.green_flags(token_ids).numpy()


def score_positions(wm: Watermark, token_ids: torch.Tensor, common: CommonUnits | None = None,
                    dedup: bool = True, with_units: bool = False,
                    with_identities: bool = False, match=None) -> tuple[np.ndarray, ...]:
    """Green flags [T - h] and previous occurrences [T - h] (see ``previous_occurrence``), one pass;
    with ``with_units`` also each position's dedup unit [T - h, k] (``Watermark.scored_positions``),
    with ``with_identities`` also each unit's key-free identity [T - h] (``Watermark.unit_identities``).

    Without ``dedup`` every position is its own first occurrence (-1). With a ``common`` table
    (kgw specs) a position whose unit is common in human text points at itself: it counts nowhere,
    in the text or in a window (``detector.common_units``). ``match``: a ``db.output_grams.MatchRequest`` the
    C loop also runs (``detector.scoring_kernel.kgw_scores``); untouched on the Python path."""
    fast = kgw_scores(wm, token_ids, common, dedup, match)  # keyed kgw specs: the same arrays from one C loop
    if fast is not None:
        flags, prev, units, named = fast
        return (flags, prev) + ((units,) if with_units else ()) + ((named,) if with_identities else ())
    flags, units, *named = wm.scored_positions(token_ids, with_identities=common is not None or with_identities)
    prev = _previous(units.numpy()) if dedup else np.full(units.shape[0], -1, dtype=np.int64)
    if common is not None:
        excluded = common.excluded(wm, token_ids, named[0])
        prev[excluded] = excluded
    return (flags.numpy(), prev) + ((units.numpy(),) if with_units else ()) + ((named[0],) if with_identities else ())


def previous_occurrence(wm: Watermark, token_ids: torch.Tensor) -> np.ndarray:
    """Int [T - h]: index of the previous scored position with the same dedup unit, else -1.

    A position is a first occurrence, counted under dedup, iff its entry is -1. The unit is
    ``Watermark.scored_positions``' : the (h+1)-gram (transformers' unit), or for minhash and
    selfhash the (context seed, token) pair that alone decides the flag — counting such a pair
    twice counts one coin twice, which inflated the variance of z on human text (measured on the
    Lee corpus: var 1.19 with n-gram units, 1.01 with pairs)."""
    return _previous(wm.scored_positions(token_ids)[1].numpy())


def _previous(units: np.ndarray) -> np.ndarray:
    return previous_and_order(units)[0]


def forced_scored_positions(forced_tokens: tuple[int, ...], h: int, scorable: int) -> np.ndarray:
    """Scored-position indices (token index - h) of the forced tokens that are scorable at all."""
    positions = np.asarray(sorted(set(forced_tokens)), dtype=np.int64) - h
    return positions[(positions >= 0) & (positions < scorable)]


def counted_positions(prev: np.ndarray, dedup: bool = True) -> np.ndarray:
    """Bool mask of the positions that enter T: first occurrences (``prev`` < 0). Positions left out
    of every count (forced, or common in human text) point at themselves and never enter it. With
    ``dedup`` False, every position that is not left out counts."""
    if dedup:
        return prev < 0
    return prev != np.arange(prev.shape[0])


# ----------------------------------------------------------------------------- whole text


@dataclass(slots=True)
class KeyScore:
    """The whole-text score under one key (or one public hf spec: key_id None)."""

    key_id: str | None
    num_tokens_scored: int
    num_green_tokens: int
    z_score: float
    p_value: float  # exact one-sided binomial
    p_value_normal: float
    p_value_corrected: float = float("nan")  # Holm across the keys tested

    def to_dict(self) -> dict:
        return {
            "key_id": self.key_id,
            "num_tokens_scored": self.num_tokens_scored,
            "num_green_tokens": self.num_green_tokens,
            "z_score": _finite_or_none(self.z_score),
            "p_value": self.p_value,
            "p_value_normal": self.p_value_normal,
            "p_value_corrected": _finite_or_none(self.p_value_corrected),
        }


def score_counts(key_id: str | None, green: int, total: int, gamma: float) -> KeyScore:
    z = z_score(green, total, gamma)
    return KeyScore(key_id, int(total), int(green), z, p_value_binomial(int(green), int(total), gamma),
                    p_value_normal(z))


def correct_across_keys(scores: list[KeyScore]) -> KeyScore:
    """Fill each score's Holm-adjusted p; return the best key (smallest p, then largest z)."""
    adjusted = holm([s.p_value for s in scores])
    for score, p in zip(scores, adjusted):
        score.p_value_corrected = p
    return min(scores, key=lambda s: (s.p_value, -_z_or_minus_inf(s.z_score)))


def expected_green_fraction(spec: WatermarkSpec) -> float:
    """Green fraction of watermarked text generated at maximum entropy.

    Kirchenbauer et al. (2023), Theorem 2 with spike entropy 1: gamma e^delta / (1 + gamma (e^delta - 1));
    the hard mode makes every scored token green. Lower-entropy text has less: this is a best case."""
    if spec.hard:
        return 1.0
    boost = math.exp(spec.delta)
    return spec.gamma * boost / (1.0 + spec.gamma * (boost - 1.0))


def min_scored_tokens(spec: WatermarkSpec, z_threshold: float) -> int:
    """Scored positions below which a negative is not informative (``insufficient_text``).

    At green fraction g, the expected z after T positions is (g - gamma) sqrt(T / (gamma (1 - gamma))),
    so T >= z_threshold^2 gamma (1 - gamma) / (g - gamma)^2 is the first length at which watermarked
    text can be expected to reach the threshold. g is the best-case green fraction of the spec
    (``expected_green_fraction``); shorter texts would be missed even when watermarked, so calling
    them ``not_watermarked`` would claim more than the test can tell. With delta = 0 (no expected
    excess) this falls back to the all-green bound, ``watermark.stats.min_tokens_for_threshold``.
    Example: gamma 0.25, delta 2, z 4 -> g = 0.711, T = 15."""
    gamma = spec.gamma
    floor = min_tokens_for_threshold(z_threshold, gamma)
    excess = expected_green_fraction(spec) - gamma
    if excess <= 1e-12:
        return floor
    needed = math.ceil(z_threshold**2 * gamma * (1.0 - gamma) / excess**2 - 1e-9)
    return max(floor, needed)


def verdict_of(p_value: float, num_scored: int, alpha: float, min_tokens: int) -> str:
    """Significant -> watermarked (valid at any length); else too short -> insufficient_text."""
    if num_scored > 0 and p_value <= alpha:
        return WATERMARKED
    if num_scored < min_tokens:
        return INSUFFICIENT_TEXT
    return NOT_WATERMARKED


@functools.lru_cache(maxsize=256)  # a handful of (alpha, keys) pairs per service; scipy's isf costs ~0.3 ms
def effective_z(alpha: float, tests: int) -> float:
    """The z a single test must reach when ``tests`` share alpha (Bonferroni)."""
    return z_for_p(alpha / max(1, tests))


def _finite_or_none(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _z_or_minus_inf(z: float) -> float:
    return z if math.isfinite(z) else float("-inf")
