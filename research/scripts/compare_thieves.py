"""One figure from several ``provmark eval security`` runs of the same spec with different thieves
(``--estimator``): spoof success against N, as the detector accepts it and with the spoof check on.

    python research/scripts/compare_thieves.py --run "pair vote=RUN1" --run "learned anchors=RUN2" \
        --run "told the anchors (bound)=RUN3" --label selfhash-h4-g0.25-d2 --out docs/img/x.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def points(results: dict, label: str) -> list[tuple[int, float, float | None]]:
    """(N, share detected, share detected and not spoof_suspected) per N with a spoofing section."""
    out = []
    for n, section in results.get(label, {}).items():
        if n.isdigit() and "spoofing" in section:
            spoofing = section["spoofing"]
            out.append((int(n), spoofing["generated"]["success_rate"],
                        spoofing.get("spoof_check", {}).get("success_with_spoof_check")))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                        help="a run's name in the legend and its output folder (results.json inside)")
    parser.add_argument("--label", required=True, help="the spec's label in results.json")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args(argv)
    runs = []
    for item in args.run:
        name, sep, folder = item.partition("=")
        path = Path(folder) / "results.json"
        if not sep or not name or not path.is_file():
            print(f"--run: expected NAME=DIR with DIR/results.json, got {item!r}", file=sys.stderr)
            return 2
        found = points(json.loads(path.read_text()), args.label)
        if not found:
            print(f"--run {name}: no spoofing results for {args.label!r} in {path}", file=sys.stderr)
            return 2
        runs.append((name, found))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for name, found in runs:
        line, = ax.plot([n for n, _, _ in found], [d for _, d, _ in found], marker="o", label=f"{name}: detected")
        checked = [(n, c) for n, _, c in found if c is not None]
        if checked:
            ax.plot([n for n, _ in checked], [c for _, c in checked], marker="s", linestyle=":", color=line.get_color(),
                    label=f"{name}: and not spoof_suspected")
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("stolen watermarked tokens N")
    ax.set_ylabel("spoofs accepted as ours")
    ax.set_title(args.label, fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
