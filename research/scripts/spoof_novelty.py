"""Novelty as a spoof statistic, measured on a cached ``provmark eval security`` run (docs/security.md, "A lead
against the bound").

A thief steers toward units whose colours it learnt, i.e. units the service emitted. For one run folder (its
cached watermarked corpus, held-out outputs and spoofs) this scores every text the way the shipped spoof check
does (``detector.spoof_check.counted_units`` against the run's memory: the whole watermarked corpus, each of
its outputs without itself for the null) and compares, at a 1e-3 level:

  current    the shipped statistic (greens against log(count + 1/2)), normal fit of its null
  novelty    (n/2 - unseen) / sqrt(n/4), unseen = counted units the memory never held; normal fit and its
             own empirical tail
  or-rule    current (normal fit, 5e-4) or novelty (empirical, 5e-4)

    python research/scripts/spoof_novelty.py --run RUN --estimator known-units     # RUN: the run's --out folder

It reads the run's config from RUN/results.json (the same texts come from its cache; nothing is generated when
the run is complete) and prints one JSON document.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detector import common_units  # noqa: E402
from detector.spoof_check import OutputCounts, counted_units, spoof_statistic  # noqa: E402
from evaluation import attack_measures as measure  # noqa: E402
from evaluation.security_attacks import AttackConfig, AttackRun  # noqa: E402

ALPHA = 1e-3


def novelty(f: dict, field: str = "unseen") -> float:
    return (f["n"] / 2 - f[field]) / math.sqrt(f["n"] / 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a complete `provmark eval security` output folder")
    parser.add_argument("--estimator", required=True, choices=("pairs", "learned-anchors", "known-units"))
    parser.add_argument("--siblings", type=int, default=0,
                        help="also: novelty with the K outputs that share most units with the text left out")
    args = parser.parse_args(argv)

    from scipy.stats import norm
    from tqdm import tqdm


    run_dir = Path(args.run)
    saved = json.loads((run_dir / "results.json").read_text())["config"]
    config = AttackConfig(attacks=("spoofing",), schemes=tuple(saved["schemes"]),
                          steal_tokens=tuple(saved["steal_tokens"]), tokens=saved["tokens"],
                          eval_texts=saved["eval_texts"], rates=tuple(saved["rates"]),
                          spoof_delta=saved["spoof_delta"], seed=saved["seed"], estimator=args.estimator)
    run = AttackRun(config, run_dir, progress=True)
    try:
        label = next(iter(run.marks))
        mark, n_stolen = run.marks[label], max(config.steal_tokens)
        corpus, held = run.training_texts(), run.held_out()
        estimate = run.estimate(label, corpus[label], n_stolen)
        spoofed = measure.spoof_generations(run, {(label, n_stolen): estimate})[label, n_stolen]
        common = common_units.for_vocabulary(run.vocab)
        outputs = [run.encode(g.text) for g in corpus[label]]
        counts = OutputCounts()
        holders: dict[int, list[int]] = {}  # unit -> the outputs that hold it (for --siblings)
        for row, ids in enumerate(outputs):
            units = mark.unit_identities(ids)
            counts.add(units)
            for unit in np.unique(units).tolist():
                holders.setdefault(unit, []).append(row)

        def features(ids, row: int | None) -> dict | None:
            """``row``: the text is that output (scored without itself, as the null is)."""
            scores, counted, identities = counted_units(mark, ids, common)
            if scores.shape[0] < 16:
                return None
            seen = (counts.of(identities, identities) if row is not None else counts.of(identities))[counted]
            unseen = seen == 0
            out = {"current": spoof_statistic(scores, np.log(seen + 0.5)).z, "n": int(scores.shape[0]),
                   "unseen": int(unseen.sum()), "unseen_green": float(scores[unseen].sum())}
            if args.siblings:  # unseen once the K outputs sharing most of the text's units are left out too
                lists = [holders.get(u, ()) for u in identities[counted].tolist()]
                # a unit held by more than K + 1 outputs stays seen whichever K are left out, and names no sibling
                rare = [held for held in lists if len(held) <= args.siblings + 1]
                shared = collections.Counter(r for held in rare for r in held if r != row)
                siblings = {r for r, _ in shared.most_common(args.siblings)}
                out["unseen_siblings"] = int(sum(all(r == row or r in siblings for r in held) for held in rare))
            return out

        null = [f for f in (features(ids, row) for row, ids in enumerate(tqdm(outputs, desc="null (own outputs)")))
                if f]
        genuine = [f for f in (features(run.encode(g.text), None) for g in held[label]) if f]
        spoof_rows = [features(run.encode(g.text), None) for g in spoofed]  # None: too few units (never flagged)
        spoofs = [f for f in spoof_rows if f]
        detected = [s["detected"] for s in run.detect(label, [g.text for g in spoofed])]
    finally:
        run.close()

    variants = {"novelty": "unseen"} | ({"novelty_siblings": "unseen_siblings"} if args.siblings else {})
    current = np.array([f["current"] for f in null])
    current = current[np.isfinite(current)]
    cut = {"current": current.mean() + current.std(ddof=1) * norm.isf(ALPHA),
           "or_current": current.mean() + current.std(ddof=1) * norm.isf(ALPHA / 2)}
    rules = {"current": lambda f: f["current"] >= cut["current"]}
    for name, field in variants.items():
        fresh = np.array([novelty(f, field) for f in null])
        cut[f"{name}_normal"] = fresh.mean() + fresh.std(ddof=1) * norm.isf(ALPHA)
        cut[f"{name}_empirical"] = float(np.quantile(fresh, 1 - ALPHA))
        cut[f"or_{name}"] = float(np.quantile(fresh, 1 - ALPHA / 2))
        rules[f"{name}_normal"] = lambda f, n=name, k=field: novelty(f, k) >= cut[f"{n}_normal"]
        rules[f"{name}_empirical"] = lambda f, n=name, k=field: novelty(f, k) >= cut[f"{n}_empirical"]
        rules[f"or_{name}"] = (lambda f, n=name, k=field:
                               f["current"] >= cut["or_current"] or novelty(f, k) >= cut[f"or_{n}"])

    def share(rows: list[dict], key: str, of: str) -> float:
        return float(sum(f[key] for f in rows) / max(1, sum(f[of] for f in rows)))

    report = {"run": str(run_dir), "estimator": args.estimator, "siblings": args.siblings,
              "null_outputs": len(null), "alpha": ALPHA,
              "thresholds": {k: round(float(v), 3) for k, v in cut.items()},
              "unseen_share_median": {f"{name} ({field})": float(np.median([f[field] / f["n"] for f in rows]))
                                      for name, rows in (("null", null), ("genuine", genuine), ("spoofs", spoofs))
                                      for field in variants.values()},
              "unseen_share_null_quantile_0.001": float(np.quantile([f["unseen"] / f["n"] for f in null], 0.001)),
              "green_rate_on_unseen": {name: share(rows, "unseen_green", "unseen")
                                       for name, rows in (("null", null), ("genuine", genuine), ("spoofs", spoofs))},
              "rules": {name: {"own_outputs_flagged": float(np.mean([rule(f) for f in null])),
                               "genuine_flagged": int(sum(rule(f) for f in genuine)), "genuine": len(genuine),
                               "spoofs_flagged": int(sum(rule(f) for f in spoofs)), "spoofs": len(spoofs),
                               "detected_and_not_flagged": int(sum(d and not (f is not None and rule(f))
                                                                   for d, f in zip(detected, spoof_rows)))}
                        for name, rule in rules.items()}}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
