"""A picture of keys' nulls: each key's z on human text against N(0, 1), and its mean per length bucket."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from detector.calibration import MIN_BUCKET_TEXTS, bucket_label


def plot_calibrations(calibrations, path: str | Path) -> Path:
    """One row per calibration: histogram of z with the N(0, 1) density; mean z per scored-length bucket
    with +-2 standard errors (0 is the promise)."""
    import matplotlib  # noqa: PLC0415 (matplotlib, heavy: loaded only to draw the plot)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the Agg backend)

    rows = len(calibrations)
    fig, axes = plt.subplots(rows, 2, figsize=(11, 3.2 * rows), squeeze=False)
    grid = np.linspace(-4.5, 4.5, 200)
    for (hist, buckets), cal in zip(axes, calibrations):
        z = np.asarray(cal.z_values, dtype=np.float64)
        hist.hist(z, bins=np.linspace(-4.5, 4.5, 46), density=True, color="#7aa6c2", label=f"{z.size} human texts")
        hist.plot(grid, stats.norm.pdf(grid), color="black", lw=1.5, label="N(0, 1)")
        hist.set_title(f"key {cal.key_id}: null of z ({cal.calibration_id})", fontsize=10)
        hist.set_xlabel("z")
        hist.legend(fontsize=8)
        shown = [b for b in cal.buckets if b.n >= MIN_BUCKET_TEXTS]
        x = np.arange(len(shown))
        means = [b.mean for b in shown]
        errors = [2 * b.sd / np.sqrt(b.n) for b in shown]
        buckets.errorbar(x, means, yerr=errors, fmt="o", color="#c2577a", capsize=3)
        buckets.axhline(0.0, color="black", lw=1)
        buckets.set_xticks(x, [bucket_label(b.index) for b in shown], fontsize=8)
        buckets.set_xlabel("scored units T")
        buckets.set_ylabel("mean z (+-2 SE)")
        buckets.set_title(cal.spec, fontsize=9)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
