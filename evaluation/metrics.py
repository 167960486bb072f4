"""The numbers of a robustness evaluation: detection rates at thresholds, ROC, prefix detection,
perplexity and repetition.

Detection scores are z-scores (higher = more watermark-like). A text whose z is undefined (nothing
could be scored) counts as -inf: it is never detected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from evaluation.prefix import prefix_p_values

DISTINCT_N = (2, 3)  # distinct-n (Li et al. 2016): the text's share of unique n-grams
REPETITION_N = 4  # seq-rep-4 of Welleck et al. 2019 ("Neural text generation with unlikelihood training")
ROC_MAX_POINTS = 201  # points kept per stored ROC curve (plots need no more)


def as_scores(values: Sequence[float | None]) -> np.ndarray:
    """Float array with None / nan as -inf (never detected)."""
    out = np.array([-math.inf if v is None else float(v) for v in values], dtype=np.float64)
    out[np.isnan(out)] = -math.inf
    return out


def empirical_threshold(negatives: Sequence[float], fpr: float) -> float:
    """The smallest z threshold (detected iff z >= it) at which at most ``fpr`` of ``negatives``
    are detected. With fewer than 1/fpr negatives that is just above the largest negative."""
    if not 0.0 < fpr < 1.0:
        raise ValueError(f"fpr: expected a probability strictly between 0 and 1, got {fpr!r}")
    neg = np.sort(as_scores(negatives))[::-1]
    if neg.size == 0:
        raise ValueError("negatives: need at least one negative score")
    allowed = math.floor(fpr * neg.size + 1e-9)  # negatives that may lie at or above the threshold
    if allowed >= neg.size:
        return -math.inf
    return float(np.nextafter(neg[allowed], math.inf))


def detection_rate(scores: Sequence[float], threshold: float) -> float:
    """Fraction of ``scores`` at or above ``threshold``."""
    values = as_scores(scores)
    return float(np.mean(values >= threshold)) if values.size else float("nan")


def roc_auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """P(a random positive scores above a random negative), ties counted half (Mann-Whitney U / n m)."""
    pos, neg = as_scores(positives), as_scores(negatives)
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    neg_sorted = np.sort(neg)
    below = np.searchsorted(neg_sorted, pos, side="left")
    at_or_below = np.searchsorted(neg_sorted, pos, side="right")
    return float(np.sum(below + 0.5 * (at_or_below - below)) / (pos.size * neg.size))


def roc_curve(positives: Sequence[float], negatives: Sequence[float],
              max_points: int = ROC_MAX_POINTS) -> dict[str, list[float]]:
    """{"fpr": [...], "tpr": [...]} from (0, 0) to (1, 1), thresholds at every distinct score,
    thinned to about ``max_points`` points (the first and last are kept)."""
    pos, neg = as_scores(positives), as_scores(negatives)
    thresholds = np.unique(np.concatenate([pos, neg]))[::-1]
    fpr = [0.0] + [float(np.mean(neg >= t)) for t in thresholds]
    tpr = [0.0] + [float(np.mean(pos >= t)) for t in thresholds]
    if fpr[-1] < 1.0 or tpr[-1] < 1.0:
        fpr.append(1.0)
        tpr.append(1.0)
    if len(fpr) > max_points:
        keep = np.unique(np.linspace(0, len(fpr) - 1, max_points).round().astype(int))
        fpr, tpr = [fpr[i] for i in keep], [tpr[i] for i in keep]
    return {"fpr": fpr, "tpr": tpr}


def perplexity(token_logprobs: np.ndarray) -> float:
    """exp(-mean log p) over the tokens given; nan for none."""
    values = np.asarray(token_logprobs, dtype=np.float64)
    return float(math.exp(-values.mean())) if values.size else float("nan")


def repetition_rate(token_ids: Sequence[int], n: int = REPETITION_N) -> float:
    """seq-rep-n: the fraction of the text's n-grams that repeat an earlier one (1 - distinct / all)."""
    ids = list(token_ids)
    grams = [tuple(ids[i: i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def distinct_n(token_ids: Sequence[int], n: int) -> float:
    """distinct-n: unique n-grams / all n-grams of one text (1 = no n-gram repeats); nan when too short."""
    ids = list(token_ids)
    grams = [tuple(ids[i: i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """Median, mean, first and third quartile of the finite values (None when there are none)."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return {"median": None, "mean": None, "q1": None, "q3": None, "n": 0}
    q1, median, q3 = np.percentile(arr, [25, 50, 75])
    return {"median": float(median), "mean": float(arr.mean()), "q1": float(q1), "q3": float(q3), "n": int(arr.size)}


# ------------------------------------------------------------------------ detection along prefixes
def prefix_detection(watermark, token_ids, alpha: float, dedup: bool = True, common=None) -> np.ndarray:
    """Bool [T + 1]: entry L says whether the prefix of L tokens is detected (exact p <= alpha, the
    detector's rule for one key); see ``evaluation.prefix.prefix_p_values``."""
    return prefix_p_values(watermark, token_ids, dedup, common) <= alpha


def tokens_to_detect(detected: np.ndarray) -> int | None:
    """The shortest detected prefix length, None if no prefix is detected."""
    hits = np.flatnonzero(detected)
    return int(hits[0]) if hits.size else None


def detection_by_length(curves: Sequence[np.ndarray], lengths: Sequence[int]) -> list[float]:
    """For each length L, the fraction of texts whose first L tokens are detected (texts shorter
    than L count with their whole length)."""
    out = []
    for length in lengths:
        hits = [bool(c[min(length, c.shape[0] - 1)]) for c in curves]
        out.append(float(np.mean(hits)) if hits else float("nan"))
    return out
