"""Choosing the bounded promise's margins (``detector.promise.BOUNDED_MARGIN``) and the measured promise's
(``MEASURED_MARGIN``) from research/scripts/key_shift_collections.py's scores, on the fit collections only, and judging the
choice on the held-out ones (``key_shift_table.HELD_OUT``; docs/research/key-shift-collections.md).

    python research/scripts/key_shift_fit.py [--corpora /work/corpora] [--target 0.002] [--code-share 0.06]

A cell is one key on one collection; its mean effective z (``key_shift_table.effective_z``: the p-value a judge reads,
the margin's where it raised the exact one) implies a false-positive rate at z = 4 within twice the stated one while it
is at most BAR. Per group of collections (code; documents; paragraphs), the share of cells beyond BAR for a random
collection of the group and a random key is estimated from the mixture of normals fitted per collection over its keys
(mean and spread of the cell means): the margins are the smallest that bring it to ``--target`` or below, code first
(from the code collections), then prose (from the documents and paragraphs, the code margin applied to their code-like
texts). The measured margins the same way, on the judged halves of the split collections (``mode=measured``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import key_shift_table as table  # noqa: E402

from detector import promise  # noqa: E402

BAR = float(special.ndtri(1 - 2 * special.ndtr(-4.0)) - 4.0) * -1  # mean z at which the rate at 4 doubles: 0.1525
JUDGED_TEXTS = 200  # the smallest cell judged: its mean has this many texts' noise
GRID = np.round(np.arange(0.0, 1.61, 0.05), 2)
GROUPS = {"code": ("code",), "prose": ("documents", "paragraphs")}


def part_sums(item: dict, spec: str, mode: str, code_share: float) -> dict:
    """Per key: (sum of effective z over prose-kind texts, over code-kind texts, texts) for every margin of GRID, the
    texts of each kind held to that margin (and the measured guard of the split's half A, for ``measured``)."""
    scores, fractions = item["scores"], item["codeish"]
    group = "yours" if mode == "measured" else "shipped"
    green, total = scores[f"{spec}/{group}_G"], scores[f"{spec}/{group}_T"]
    if mode == "measured":
        fractions = fractions[1::2]
    out = {"prose": np.zeros((len(GRID), green.shape[0])), "code": np.zeros((len(GRID), green.shape[0])),
           "n": np.zeros(green.shape[0])}
    for k in range(green.shape[0]):
        scored = total[k] > 0
        g, t, code = green[k][scored], total[k][scored], fractions[scored] >= code_share
        out["n"][k] = g.size
        for j, margin in enumerate(GRID):
            z = table.effective_z(g, t, (np.full(g.size, margin), np.ones(g.size)))
            out["code"][j, k], out["prose"][j, k] = z[code].sum(), z[~code].sum()
    return out


def tail(cell_means: list[np.ndarray], texts: list[np.ndarray]) -> float:
    """The share of cells beyond BAR for a random collection of the group and a random key, in a cell of JUDGED_TEXTS
    texts: per collection a normal whose mean is its keys' mean and whose variance is its key part (the variance of
    the cell means over keys beyond the 1/n noise of n texts each) plus the noise of JUDGED_TEXTS texts."""
    found = []
    for m, n in zip(cell_means, texts):
        key_part = max(0.0, m.var(ddof=1) - float(np.mean(1.0 / np.maximum(n, 1))))
        found.append(special.ndtr(-(BAR - m.mean()) / np.sqrt(key_part + 1.0 / JUDGED_TEXTS)))
    return float(np.mean(found))


def choose(sums: dict, kinds: dict, target: float) -> tuple[float, float, dict]:
    """(prose margin, code margin, the tails per group at them): the smallest of GRID that meet ``target``."""
    def means(names, jp, jc):
        return [(sums[c]["prose"][jp] + sums[c]["code"][jc]) / np.maximum(sums[c]["n"], 1) for c in names]

    def tail_of(names, jp, jc):
        return tail(means(names, jp, jc), [sums[c]["n"] for c in names])

    groups = {g: [c for c in sums if kinds[c] in members] for g, members in GROUPS.items()}
    jc = next((j for j in range(len(GRID)) if tail_of(groups["code"], 0, j) <= target), len(GRID) - 1)
    jp = next((j for j in range(len(GRID)) if tail_of(groups["prose"], j, jc) <= target), len(GRID) - 1)
    tails = {g: tail_of(names, jp, jc) for g, names in groups.items() if names}
    return float(GRID[jp]), float(GRID[jc]), tails


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="/work/corpora")
    parser.add_argument("--target", type=float, nargs="+", default=[0.002, 0.005])
    parser.add_argument("--code-share", type=float, default=promise.CODE_SHARE)
    parser.add_argument("--out", default="benchmarks/results/key_shift_fit.json")
    args = parser.parse_args(argv)
    found = table.load(Path(args.corpora))
    kinds = {name: item["kind"] for name, item in found.items()}
    result = {"target": args.target[0], "judged_texts": JUDGED_TEXTS, "bar": BAR, "code_share": args.code_share, "margins": {}}
    for spec in table.SPECS:
        for mode in ("shipped", "measured"):
            sums = {name: part_sums(item, spec, mode, args.code_share) for name, item in found.items()}
            fit = {name: s for name, s in sums.items() if name not in table.HELD_OUT}
            held = {name: s for name, s in sums.items() if name in table.HELD_OUT}
            for target in args.target[1:]:  # looser targets: what they would save (printed, not chosen)
                print(f"{spec:11s} {mode:8s} target {target}: margins (prose, code) {choose(fit, kinds, target)[:2]}")
            prose, code, tails = choose(fit, kinds, args.target[0])
            jp, jc = list(GRID).index(prose), list(GRID).index(code)
            held_means = {c: (held[c]["prose"][jp] + held[c]["code"][jc]) / np.maximum(held[c]["n"], 1) for c in held}
            held_tails = {g: tail([held_means[c] for c in held if kinds[c] in members],
                                  [held[c]["n"] for c in held if kinds[c] in members])
                          for g, members in GROUPS.items() if any(kinds[c] in members for c in held)}
            worst = max(held_means, key=lambda c: held_means[c].max())
            result["margins"][f"{spec}/{mode}"] = {
                "prose": prose, "code": code, "fit_tails": tails, "held_out_tails": held_tails,
                "held_out_cells_beyond_bar": int(sum((m > BAR).sum() for m in held_means.values())),
                "held_out_cells": int(sum(m.size for m in held_means.values())),
                "held_out_worst": {"collection": worst, "mean": float(held_means[worst].max())}}
            print(f"{spec:11s} {mode:8s} margins prose {prose:.2f} code {code:.2f}  fit tails "
                  f"{json.dumps({g: round(v, 4) for g, v in tails.items()})}  held-out tails "
                  f"{json.dumps({g: round(v, 4) for g, v in held_tails.items()})}, cells beyond "
                  f"{result['margins'][f'{spec}/{mode}']['held_out_cells_beyond_bar']} of "
                  f"{result['margins'][f'{spec}/{mode}']['held_out_cells']} (worst {worst} "
                  f"{held_means[worst].max():+.3f})", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
