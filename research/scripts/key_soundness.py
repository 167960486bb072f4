"""Each fixed key's mean z on held-out human text, with and without the common-unit table (docs/detection.md).

    python research/scripts/key_soundness.py [--keys 12] [--specs "kgw:scheme=selfhash;..."] [--out DIR]
                                    [--after-only] [--long] [--label LABEL] [--threshold SCHEME=T ...]

Corpora: the held-out half of ``detector.human_corpora`` only (never used for the table or a key's
calibration), as independent texts: encyclopedia paragraphs (first 200 tokens), documents (news,
encyclopedia, documentation; first 800 tokens), standard-library source files and the source of
held-out third-party packages (first 1,500 tokens), and package READMEs. Writes
DIR/key_soundness.json and DIR/key_soundness.png (every key's mean z, before and after), and the
number of texts each key flags at z = 4 (exact binomial test). ``--long`` adds the held-out documents of
2,000 tokens or more (first 5,000 tokens; ``human_corpora.held_out_long_texts``). Per row: how many keys
have |mean z| above 0.15 (the bar a sound key stays under), and the part of the key-to-key spread beyond the noise of a
sample mean, ``key_part = sqrt(spread^2 - noise^2)``: what more texts would not average away.
``--threshold unigram=0.01`` scores with another common-unit threshold than the shipped one (a trial).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detector import common_units, human_corpora  # noqa: E402
from detector.scoring import score_positions  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402
from watermark.stats import p_value_binomial, p_value_normal  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

ALPHA = p_value_normal(4.0)

SPECS = "kgw:scheme=selfhash;kgw:scheme=lefthash,h=1;kgw:scheme=unigram;kgw:scheme=minhash"
BAR = 0.15  # |mean z| of one key on one corpus beyond which the key is off (3.4x the stated rate at +0.30)


def mean_z(mark: Watermark, texts: list[np.ndarray], common) -> tuple[float, float, int, int]:
    """(mean z, sd of z, texts scored, texts flagged at alpha = P(Z >= 4)) of ``texts`` under ``mark``."""
    zs, flagged = [], 0
    for ids in texts:
        flags, prev = score_positions(mark, torch.from_numpy(ids), common)
        counted = prev < 0
        total = int(counted.sum())
        if total:
            green = int((flags & counted).sum())
            zs.append((green - mark.gamma * total) / np.sqrt(total * mark.gamma * (1 - mark.gamma)))
            flagged += p_value_binomial(green, total, mark.gamma) <= ALPHA
    return float(np.mean(zs)), float(np.std(zs)), len(zs), flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=12)
    parser.add_argument("--specs", default=SPECS, help="spec strings separated by semicolons")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--after-only", action="store_true", help="only the shipped table (no 'before' rows)")
    parser.add_argument("--long", action="store_true", help="also the held-out texts of 2,000 to 5,000 tokens")
    parser.add_argument("--label", default="key_soundness", help="file names of the JSON and the plot")
    parser.add_argument("--threshold", action="append", default=[], metavar="SCHEME=T",
                        help="try another common-unit threshold for a scheme (repeatable)")
    args = parser.parse_args()
    for item in args.threshold:
        scheme, _, value = item.partition("=")
        if scheme not in common_units.THRESHOLDS:
            parser.error(f"--threshold {item}: unknown scheme {scheme!r} ({', '.join(common_units.THRESHOLDS)})")
        try:
            common_units.THRESHOLDS[scheme] = float(value)
        except ValueError:
            parser.error(f"--threshold {item}: expected SCHEME=NUMBER")
    vocab = load_vocabulary()
    table = common_units.for_vocabulary(vocab)
    corpora = human_corpora.held_out_texts(vocab)
    if args.long:
        corpora.update(human_corpora.held_out_long_texts(vocab))
    modes = ("after",) if args.after_only else ("before", "after")
    secrets = [hashlib.sha256(f"provmark-key-soundness/{i}".encode()).digest() for i in range(args.keys)]
    rows = []
    jobs = [(s, c, mode) for s in args.specs.split(";") for c in corpora for mode in modes]
    for spec, corpus, mode in tqdm(jobs, desc="specs x corpora", unit="cell"):
        means, sds, n, flagged = [], [], 0, 0
        for secret in secrets:
            m, sd, n, f = mean_z(Watermark(spec, secret, vocab.vocab_size), corpora[corpus], table if mode == "after" else None)
            means.append(m)
            sds.append(sd)
            flagged += f
        spread, noise = float(np.std(means)), float(np.mean(sds) / np.sqrt(n))
        rows.append({"spec": spec, "corpus": corpus, "mode": mode, "n": n, "mean_z_per_key": means,
                     "spread": spread, "noise": noise, "key_part": float(np.sqrt(max(spread**2 - noise**2, 0.0))),
                     "max_abs_mean_z": float(np.max(np.abs(means))),
                     "keys_beyond_bar": int(np.sum(np.abs(means) > BAR)), "flagged": flagged,
                     "flagged_expected": ALPHA * n * len(secrets)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"keys": args.keys, "common_units": {"digest": table.digest, "entries": len(table)},
               "thresholds": dict(common_units.THRESHOLDS), "rows": rows}
    (out / f"{args.label}.json").write_text(json.dumps(summary, indent=1))
    plot(rows, out / f"{args.label}.png")
    for r in rows:
        print(f"{r['spec']:28s} {r['corpus']:12s} {r['mode']:6s} n={r['n']:5d} spread {r['spread']:.3f} "
              f"noise {r['noise']:.3f} key part {r['key_part']:.3f} max |mean z| {r['max_abs_mean_z']:.3f} "
              f"beyond {BAR}: {r['keys_beyond_bar']} of {args.keys} flagged {r['flagged']}")
    return 0


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = list(dict.fromkeys(r["spec"] for r in rows))
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    fig, axes = plt.subplots(1, len(specs), figsize=(4 * len(specs), 3.6), sharey=True, squeeze=False)
    for ax, spec in zip(axes[0], specs):
        for j, corpus in enumerate(corpora):
            for mode, colour, dx in (("before", "#c2577a", -0.15), ("after", "#3f7fa6", 0.15)):
                r = next((r for r in rows if r["spec"] == spec and r["corpus"] == corpus and r["mode"] == mode), None)
                if r is None:  # --after-only
                    continue
                ax.scatter(np.full(len(r["mean_z_per_key"]), j + dx), r["mean_z_per_key"], s=12, color=colour,
                           label=mode if j == 0 else None)
        ax.axhspan(-BAR, BAR, color="0.9", zorder=0)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(corpora)), corpora, rotation=30, ha="right", fontsize=8)
        ax.set_title(spec.removeprefix("kgw:"), fontsize=9)
    axes[0][0].set_ylabel("mean z of human texts, one dot per key")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
