"""Plots of an evaluation's results (matplotlib, Agg backend: files only, no display needed).

``write_plots(results, out_dir)`` writes, per scheme:
  ``z_vs_rate_<label>.png``            median z (and quartiles) against the edit rate, one line per attack
  ``tpr_vs_rate_<label>.png``          detection rate at the default threshold against the edit rate
  ``roc_<label>.png``                  ROC curves, one panel per attack, one curve per rate (log FPR axis)
  ``detection_vs_length_<label>.png``  detection rate against the number of tokens read
  ``layers_vs_rate_<label>.png``       per attack, the fraction recognised at a false-match rate of 1e-4 by the
                                       watermark, the 5-gram match, the semantic match and any of them
and once: ``quality_vs_delta.png`` (perplexity and detection rate against delta; delta 0 = no watermark),
and with ``--lengths`` the side-by-side comparison of every scheme (``evaluation.compare_report``).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on servers and in tests
import matplotlib.pyplot as plt

from evaluation.compare_report import write_comparison

Z_LINE = 4.0  # the detector's default threshold, drawn for reference
DPI = 110


def write_plots(results: dict, out_dir: str | Path) -> list[str]:
    """Write every plot; returns their file names (relative to ``out_dir``)."""
    out = Path(out_dir)
    written = []
    for scheme in results["schemes"]:
        label = scheme["label"]
        for name, draw in (("z_vs_rate", _z_vs_rate), ("tpr_vs_rate", _tpr_vs_rate), ("roc", _roc),
                           ("detection_vs_length", _detection_vs_length)):
            path = out / f"{name}_{label}.png"
            figure = draw(scheme)
            figure.savefig(path, dpi=DPI, bbox_inches="tight")
            plt.close(figure)
            written.append(path.name)
        if any("own_output_layers" in c for c in scheme["results"]):
            path = out / f"layers_vs_rate_{label}.png"
            figure = _layers_vs_rate(scheme)
            figure.savefig(path, dpi=DPI, bbox_inches="tight")
            plt.close(figure)
            written.append(path.name)
    figure = _quality_vs_delta(results)
    figure.savefig(out / "quality_vs_delta.png", dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    written.append("quality_vs_delta.png")
    return written + write_comparison(results, out)


def _by_attack(scheme: dict) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for cell in scheme["results"]:
        groups.setdefault(cell["attack"], []).append(cell)
    for cells in groups.values():
        cells.sort(key=lambda c: c["rate"])
    return groups


def _styles(count: int):
    colors = plt.get_cmap("tab20").colors
    markers = "o^sDv<>pP*Xh"
    return [(colors[i % len(colors)], markers[i % len(markers)]) for i in range(count)]


def _finite(value) -> float:
    return float(value) if value is not None and math.isfinite(value) else float("nan")


def _z_vs_rate(scheme: dict):
    def draw(axis, cells, color, marker, name):
        rates = [c["rate"] for c in cells]
        axis.plot(rates, [_finite(c["median_z"]) for c in cells], marker=marker, color=color, label=name)
        axis.fill_between(rates, [_finite(c["z"]["q1"]) for c in cells], [_finite(c["z"]["q3"]) for c in cells],
                          color=color, alpha=0.08)

    figure, axis = _per_attack(scheme, draw)
    axis.axhline(Z_LINE, color="black", linestyle="--", linewidth=1, label=f"z = {Z_LINE:g} (default threshold)")
    _dress(axis, "edit rate (fraction of tokens / words / characters / sentences edited)",
           "median z-score (band: quartiles)", f"Watermark strength under edits: {scheme['label']}")
    return figure


def _tpr_vs_rate(scheme: dict):
    def draw(axis, cells, color, marker, name):
        axis.plot([c["rate"] for c in cells], [c["tpr_default"] for c in cells], marker=marker, color=color, label=name)

    figure, axis = _per_attack(scheme, draw)
    axis.set_ylim(-0.02, 1.02)
    _dress(axis, "edit rate", "detected fraction (default threshold)", f"Detection rate under edits: {scheme['label']}")
    return figure


LAYERS = (("watermark", "-"), ("five_gram", "--"), ("semantic", ":"), ("any", "-."))
LAYER_FMR = "0.0001"


def _layers_vs_rate(scheme: dict):
    """Where each layer holds: recognised fraction against the edit rate, a colour per attack, a line per layer."""
    def draw(axis, cells, color, marker, name):
        cells = [c for c in cells if "own_output_layers" in c]
        rates = [c["rate"] for c in cells]
        for layer, style in LAYERS:
            values = [c["own_output_layers"]["at_fmr"][LAYER_FMR][layer] for c in cells]
            axis.plot(rates, [_finite(v) for v in values], marker=marker, color=color, linestyle=style,
                      label=f"{name}: {layer.replace('_', '-')}")

    figure, axis = _per_attack(scheme, draw)
    axis.set_ylim(-0.02, 1.02)
    _dress(axis, "edit rate", "recognised as the source output (false-match rate 1e-4)",
           f"Which layer recognises attacked output: {scheme['label']}")
    return figure


def _per_attack(scheme: dict, draw):
    """One figure, ``draw(axis, cells, color, marker, attack)`` once per attack (cells sorted by rate)."""
    groups = _by_attack(scheme)
    figure, axis = plt.subplots(figsize=(8, 5))
    for (name, cells), (color, marker) in zip(groups.items(), _styles(len(groups))):
        draw(axis, cells, color, marker, name)
    return figure, axis


def _dress(axis, xlabel: str, ylabel: str, title: str) -> None:
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))


def _roc(scheme: dict):
    groups = _by_attack(scheme)
    columns = min(4, len(groups))
    rows = math.ceil(len(groups) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False)
    floor = 1.0 / max(2, scheme["thresholds"]["num_negatives"])  # the smallest non-zero FPR measurable
    for axis, (name, cells) in zip(axes.flat, groups.items()):
        for i, cell in enumerate(cells):
            color = plt.get_cmap("viridis")(0.9 * i / max(1, len(cells) - 1))  # dark = no edit, light = most
            fpr = [max(f, floor / 2) for f in cell["roc"]["fpr"]]
            axis.plot(fpr, cell["roc"]["tpr"], color=color,
                      label=f"rate {cell['rate']:g} (AUC {_finite(cell['roc_auc']):.3f})")
        axis.set_xscale("log")
        axis.set_xlim(floor / 2, 1.0)
        axis.set_ylim(-0.02, 1.02)
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("false-positive rate")
        axis.set_ylabel("true-positive rate")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower right")
    for axis in list(axes.flat)[len(groups):]:
        axis.set_visible(False)
    figure.suptitle(f"ROC curves: {scheme['label']} (FPR below 1/{scheme['thresholds']['num_negatives']} "
                    "drawn at the axis floor)")
    figure.tight_layout()
    return figure


def _detection_vs_length(scheme: dict):
    groups = _by_attack(scheme)
    rates = sorted({c["rate"] for c in scheme["results"] if c["rate"] > 0})
    middle = rates[len(rates) // 2] if rates else None
    figure, axis = plt.subplots(figsize=(8, 5))
    clean = next((c for c in scheme["results"] if c["rate"] == 0), None)
    if clean is not None:
        curve = clean["detection_by_length"]
        axis.plot(curve["lengths"], curve["rate"], color="black", linewidth=2.5, label="no edit")
    for (name, cells), (color, marker) in zip(groups.items(), _styles(len(groups))):
        cell = next((c for c in cells if c["rate"] == middle), None)
        if cell is None:
            continue
        curve = cell["detection_by_length"]
        axis.plot(curve["lengths"], curve["rate"], color=color, marker=marker, markersize=3,
                  label=f"{name} @ {middle:g}")
    axis.set_ylim(-0.02, 1.02)
    axis.set_xlabel("tokens read (prefix length)")
    axis.set_ylabel("detected fraction (default threshold)")
    axis.set_title(f"Detection rate against text length: {scheme['label']}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def _quality_vs_delta(results: dict):
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    sweep = results.get("quality_vs_delta") or []
    if sweep:
        deltas = [p["delta"] for p in sweep]
        left.plot(deltas, [_finite(p["quality"]["perplexity_median"]) for p in sweep], marker="o", color="tab:blue",
                  label=f"{results['schemes'][0]['label'].rsplit('-d', 1)[0]} (delta sweep)")
        left.axhline(_finite(sweep[0]["quality"]["perplexity_median"]), color="gray", linestyle=":",
                     label="no watermark")
        points = [p for p in sweep if p["tpr_default"] is not None]
        right.plot([p["delta"] for p in points], [p["tpr_default"] for p in points], marker="o", color="tab:blue",
                   label="delta sweep")
    palette = ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive"]
    for i, scheme in enumerate(results["schemes"]):
        color, marker = palette[i % len(palette)], "s^Dv<>p"[i % 7]
        if "delta=" not in scheme["spec"] and "bias=" not in scheme["spec"]:
            continue  # a sampling watermark has no delta: it is in the comparison plots instead
        delta = float(scheme["spec"].split("delta=")[1].split(",")[0]) if "delta=" in scheme["spec"] else \
            float(scheme["spec"].split("bias=")[1].split(",")[0])
        left.scatter([delta], [_finite(scheme["quality"]["watermarked"]["perplexity_median"])], color=color,
                     marker=marker, s=60, zorder=3, label=scheme["label"])
        clean = next((c for c in scheme["results"] if c["rate"] == 0), None)
        if clean is not None:
            right.scatter([delta], [clean["tpr_default"]], color=color, marker=marker, s=60, zorder=3,
                          label=scheme["label"])
    left.set_xlabel("delta (green-list logit bias; 0 = no watermark)")
    left.set_ylabel("median perplexity of the generated text")
    left.set_title("Quality cost")
    right.set_xlabel("delta")
    right.set_ylabel("detected fraction (no edits, default threshold)")
    right.set_ylim(-0.02, 1.02)
    right.set_title("Detection")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Quality cost against delta")
    figure.tight_layout()
    return figure
