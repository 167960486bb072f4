"""WinMax: the most significant window, for a watermarked passage inside a longer human text.

A 150-token watermarked paragraph pasted into 1,500 human tokens dilutes the whole-text z below
the threshold; scored on its own it stands out. We score windows of sizes 32, 64, 128, ... (powers
of two below the text length) starting every size/8 positions, so the best window covers at least
7/8 of any passage of comparable length. Windows count each distinct n-gram once inside the window
when dedup is on, so every window is itself an exact binomial test.

Testing m windows (times k keys) raises the chance that some human window looks green, so the
best window's exact p-value is multiplied by m k (Bonferroni: valid whatever the correlation
between overlapping windows, which is strong).

Speed: per size, counts for every start come from a difference array over positions (each
position adds to an interval of starts), i.e. O(T) vectorised work per size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from watermark.stats import binomial_sf

MIN_WINDOW = 32  # positions; below this even an all-green window cannot beat the corrected threshold
STRIDE_DIVISOR = 8  # windows of size W start every W/8 positions


def window_sizes(num_positions: int) -> list[int]:
    """Powers of two from MIN_WINDOW up to, not including, the number of scored positions."""
    sizes = []
    size = MIN_WINDOW
    while size < num_positions:
        sizes.append(size)
        size *= 2
    return sizes


def window_starts(num_positions: int, size: int) -> np.ndarray:
    stride = max(1, size // STRIDE_DIVISOR)
    return np.arange(0, num_positions - size + 1, stride, dtype=np.int64)


def count_windows(num_positions: int) -> int:
    """How many windows a text with this many scored positions is tested on."""
    return sum(len(window_starts(num_positions, size)) for size in window_sizes(num_positions))


def window_counts(green: np.ndarray, prev: np.ndarray | None, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, G) of every window [a, a + size) for a = 0 .. N - size.

    Position i counts in window a iff a <= i < a + size and its previous identical n-gram lies
    before a (``prev`` [N], -1 for none; ``None`` counts every position): so it adds 1 to the
    starts a in [max(prev[i] + 1, i - size + 1, 0), i], a difference-array interval."""
    n = green.shape[0]
    positions = np.arange(n, dtype=np.int64)
    low = np.maximum(positions - size + 1, 0)
    if prev is not None:
        low = np.maximum(low, prev + 1)
    total = _interval_sums(low, positions, None, n)
    greens = _interval_sums(low, positions, green.astype(np.float64), n)
    count = n - size + 1
    return total[:count], greens[:count]


def _interval_sums(low: np.ndarray, high: np.ndarray, weights: np.ndarray | None, n: int) -> np.ndarray:
    """For each start a: sum of weights of items whose interval [low, high] contains a."""
    diff = np.bincount(low, weights=weights, minlength=n + 1)
    diff[: n + 1] -= np.bincount(high + 1, weights=weights, minlength=n + 1)[: n + 1]
    return np.rint(np.cumsum(diff)[:n]).astype(np.int64)


@dataclass(slots=True)
class WindowHit:
    """The most significant window (positions are scored-position indices, half-open)."""

    key_id: str | None
    size: int
    start: int
    end: int
    num_tokens_scored: int
    num_green_tokens: int
    z_score: float
    p_value: float  # exact binomial of this window alone
    p_value_corrected: float  # times the number of windows and keys tested
    token_start: int = 0  # first scored token's index in the token sequence
    token_end: int = 0  # one past the last scored token
    char_start: int = 0  # in the ORIGINAL text
    char_end: int = 0


def best_window(green: np.ndarray, prev: np.ndarray | None, gamma: float) -> WindowHit | None:
    """The window with the smallest exact p-value over all sizes and starts (None if none)."""
    n = green.shape[0]
    best = None
    for size in window_sizes(n):
        starts = window_starts(n, size)
        total, greens = window_counts(green, prev, size)
        total, greens = total[starts], greens[starts]
        p = binomial_sf(greens, total, gamma)
        z = _z_scores(greens, total, gamma)
        i = int(np.lexsort((-np.nan_to_num(z, nan=-np.inf), p))[0])  # smallest p, then largest z
        candidate = (float(p[i]), -float(np.nan_to_num(z[i], nan=-np.inf)))
        if best is None or candidate < best[0]:
            best = (candidate, size, int(starts[i]), int(total[i]), int(greens[i]), float(z[i]))
    if best is None:
        return None
    (p, _), size, start, total, greens, z = best
    return WindowHit(None, size, start, start + size, total, greens, z, p, p)


def _z_scores(green: np.ndarray, total: np.ndarray, gamma: float) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return (green - gamma * total) / np.sqrt(total * gamma * (1.0 - gamma))


def corrected(p_value: float, tests: int) -> float:
    return min(1.0, p_value * max(1, tests))

