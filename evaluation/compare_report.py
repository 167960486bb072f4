"""Every scheme of one evaluation side by side (KGW schemes, Gumbel, SynthID): a plot per metric and a
Markdown table (``comparison.md``, the source of docs/schemes.md's table).

Written when the run measured ``by_length`` (``--lengths``). Plots:
  ``compare_tpr_<f>.png``        detected fraction at exact FPR f against the tokens read, one line per scheme
  ``compare_tokens_to_detect.png``  median tokens to detect (default threshold), clean texts
  ``compare_quality.png``        perplexity (watermarked and unwatermarked), seq-rep-4 and distinct-2
  ``compare_attacks.png``        detected fraction against the edit rate, one panel per attack
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DPI = 110


def write_comparison(results: dict, out_dir: str | Path) -> list[str]:
    """Write the comparison plots and comparison.md; returns the file names ([] without by_length)."""
    schemes = [s for s in results["schemes"] if _clean(s) and _clean(s).get("by_length")]
    if not schemes:
        return []
    out = Path(out_dir)
    written = []
    fprs = list(_clean(schemes[0])["by_length"][next(iter(_clean(schemes[0])["by_length"]))]["tpr_exact"])
    for f in fprs:
        written.append(_save(_tpr_by_length(schemes, f), out / f"compare_tpr_{f}.png"))
    written.append(_save(_tokens_to_detect(schemes), out / "compare_tokens_to_detect.png"))
    written.append(_save(_quality(schemes), out / "compare_quality.png"))
    written.append(_save(_attacks(schemes), out / "compare_attacks.png"))
    (out / "comparison.md").write_text(comparison_table(schemes, fprs), encoding="utf-8")
    return written + ["comparison.md"]


def comparison_table(schemes: list[dict], fprs: list[str]) -> str:
    """One row per scheme: TPR at each exact FPR and length, tokens to detect, quality, and the TPR under
    each attack at its largest rate."""
    lengths = list(_clean(schemes[0])["by_length"])
    attacks = sorted({c["attack"] for s in schemes for c in s["results"] if c["rate"] > 0})
    head = ["scheme"] + [f"TPR@{f} T={n}" for f in fprs for n in lengths] + [
        "tokens to detect", "ppl (unwm.)", "seq-rep-4", "distinct-2"] + [f"{a} @{_top(s, a)}" for s in schemes[:1]
                                                                         for a in attacks]
    rows = []
    for scheme in schemes:
        clean, longest = _clean(scheme), lengths[-1]
        by = clean["by_length"]
        quality = scheme["quality"]
        cells = [scheme["label"]] + [_num(by[n]["tpr_exact"][f]) for f in fprs for n in lengths] + [
            _num(clean["tokens_to_detect"]["median"], 0),
            f"{_num(quality['watermarked']['perplexity_median'], 2)} ({_num(quality['unwatermarked']['perplexity_median'], 2)})",
            _num(by[longest]["repetition_rate"], 3), _num(by[longest]["distinct_2"], 3)]
        for attack in attacks:
            top = [c for c in scheme["results"] if c["attack"] == attack and c["rate"] > 0]
            cells.append(_num(max(top, key=lambda c: c["rate"])["tpr_default"]) if top else "")
        rows.append(cells)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _clean(scheme: dict) -> dict | None:
    return next((c for c in scheme["results"] if c["rate"] == 0), None)


def _top(scheme: dict, attack: str) -> str:
    rates = [c["rate"] for c in scheme["results"] if c["attack"] == attack and c["rate"] > 0]
    return f"{max(rates):g}" if rates else ""


def _num(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _save(figure, path: Path) -> str:
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return path.name


def _lines(axis, title: str, xlabel: str, ylabel: str, unit_range: bool = True) -> None:
    """The axis dressing every comparison line plot shares."""
    if unit_range:
        axis.set_ylim(-0.02, 1.02)
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)


def _tpr_by_length(schemes: list[dict], f: str):
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    for scheme in schemes:
        by = _clean(scheme)["by_length"]
        axis.plot([int(n) for n in by], [by[n]["tpr_exact"][f] for n in by], marker="o", label=scheme["label"])
    _lines(axis, f"Clean texts detected at FPR {f} (exact p <= {f})", "tokens read (T)", "detected fraction")
    return figure


def _tokens_to_detect(schemes: list[dict]):
    figure, axis = plt.subplots(figsize=(6.5, 4.2))
    labels = [s["label"] for s in schemes]
    values = [_clean(s)["tokens_to_detect"]["median"] or float("nan") for s in schemes]
    axis.bar(range(len(labels)), values, color="tab:blue")
    axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel("median tokens to detect (default threshold)")
    axis.set_title("Tokens to detect, clean texts", fontsize=10)
    axis.grid(alpha=0.3, axis="y")
    return figure


def _quality(schemes: list[dict]):
    figure, (ppl, div) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [s["label"] for s in schemes]
    x = list(range(len(labels)))
    ppl.bar([i - 0.2 for i in x], [s["quality"]["watermarked"]["perplexity_median"] or float("nan") for s in schemes],
            width=0.4, label="watermarked")
    ppl.bar([i + 0.2 for i in x], [s["quality"]["unwatermarked"]["perplexity_median"] or float("nan") for s in schemes],
            width=0.4, label="unwatermarked (same prompts and seeds)")
    ppl.set_ylabel("median perplexity")
    for scheme in schemes:
        by = _clean(scheme)["by_length"]
        div.plot([int(n) for n in by], [by[n]["distinct_2"] for n in by], marker="o", label=f"{scheme['label']} distinct-2")
        div.plot([int(n) for n in by], [by[n]["repetition_rate"] for n in by], marker="x", linestyle="--",
                 label=f"{scheme['label']} seq-rep-4")
    for axis in (ppl,):
        axis.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3, axis="y")
    _lines(div, "Diversity (distinct-2) and repetition (seq-rep-4)", "tokens read (T)", "fraction")
    figure.suptitle("Text quality")
    figure.tight_layout()
    return figure


def _attacks(schemes: list[dict]):
    attacks = sorted({c["attack"] for s in schemes for c in s["results"]})
    columns = min(4, len(attacks))
    rows = math.ceil(len(attacks) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.8 * columns, 3.2 * rows), squeeze=False)
    for axis, attack in zip(axes.flat, attacks):
        for scheme in schemes:
            cells = sorted((c for c in scheme["results"] if c["attack"] == attack), key=lambda c: c["rate"])
            axis.plot([c["rate"] for c in cells], [c["tpr_default"] for c in cells], marker="o", label=scheme["label"])
        _lines(axis, attack, "edit rate", "detected fraction")
    for axis in list(axes.flat)[len(attacks):]:
        axis.axis("off")
    figure.suptitle("Detection under each attack (default threshold)")
    figure.tight_layout()
    return figure
