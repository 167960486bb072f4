"""The key-collection shifts of research/scripts/key_shift_collections.py's scores, per kind of text, and the bounded promise
fitted on some collections and judged on the others (docs/research/key-shift-collections.md).

    python research/scripts/key_shift_table.py [--corpora /work/corpora] [--out benchmarks/results/key_shift_collections.json]

Per spec, collection and key: the verdicts' effective z (the normal quantile of the p-value a judge reads: the
bounded value where the bound raised it, else the binomial mid-p of G of T), its mean and sd over the collection's
texts, and the false-positive rate at z = 4 that N(mean, sd) implies, as a multiple of the stated one ("ratio").
Three ways to score: ``shipped`` (today: the shipped table, no bound), ``bounded`` (the shipped table and
``detector.promise``'s bound for the text's kind), ``measured`` (the deployment gave the collection's other half:
the merged table, and the bound the key's measurement on that half allows, ``detector.promise.measured_null``).
The fit / held-out split of collections is ``HELD_OUT``: nothing there was looked at while choosing the bound.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detector import promise  # noqa: E402
from detector.calibrate import token_ids_of  # noqa: E402
from watermark.stats import Z_THRESHOLD  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

GAMMA = 0.25
SPECS = ("selfhash", "lefthash_h1", "unigram")
SCHEME = {"selfhash": "selfhash", "lefthash_h1": "lefthash", "unigram": "unigram"}
MIN_TEXTS = 100  # a cell with fewer scored texts is left out of the summaries (cells of 200+ are judged)
# collections nothing was fitted on while choosing the bound: what the fresh-key check (research/scripts/fresh_keys.py) and
# the held-out rows of the table use; the judge's shapes (C headers, a standard library, encyclopedia text) are here
HELD_OUT = ("c_glibc_headers", "go_std", "ruby_stdlib", "java_desktop", "py_pandas", "py_pygments", "py_openai",
            "rust_library", "doc_sqlalchemy", "doc_debian_reference", "encyclopedia_documents",
            "encyclopedia_paragraphs", "par_perl_pods", "doc_man_pages")


def effective_z(green: np.ndarray, total: np.ndarray, null: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Per text, the normal quantile of the p-value a judge reads: the binomial mid-p of G of T, or, where ``null``
    (shift, scale; per text) makes the p-value larger than the exact binomial one, P(Z >= (z - shift) / scale)."""
    g, t = green.astype(np.float64), total.astype(np.int64)
    below = np.where(g > 0, special.bdtr(np.maximum(g - 1, 0), t, GAMMA), 0.0)  # P(X <= G - 1)
    mid = special.bdtrc(g, t, GAMMA) + 0.5 * (special.bdtr(g, t, GAMMA) - below)
    if null is None:
        return -special.ndtri(np.clip(mid, 1e-300, 1.0))
    z = (g - GAMMA * t) / np.sqrt(t * GAMMA * (1 - GAMMA))
    shift, scale = null
    bounded = special.ndtr(-(z - shift) / scale)
    exact = special.bdtrc(g - 1, t, GAMMA)
    p = np.where(bounded > exact, bounded, mid)
    return -special.ndtri(np.clip(p, 1e-300, 1.0))


def bounded_null(scheme: str, fractions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per text (its code-like share ``fractions``), the null the bounded promise holds it to: (margin, 1)."""
    shift = np.array([promise.margin_for(scheme, promise.kind_of_fraction(f), promise.BOUNDED) for f in fractions])
    return shift, np.ones_like(shift)


def measured_null(scheme: str, fractions: np.ndarray, mine_fractions: np.ndarray, mine_z: np.ndarray):
    """Per judged text, the null of the measured promise where the key was measured on at least MIN_MEASURED_TEXTS
    of the deployment's texts of its kind (the guard of those texts' z, as ``detector.calibration.Bucket.guard``,
    shifted by MEASURED_MARGIN), else the bounded one."""
    shift, scale = bounded_null(scheme, fractions)
    mine_kinds = np.array([promise.kind_of_fraction(f) for f in mine_fractions])
    for kind in promise.KINDS:
        own = mine_z[mine_kinds == kind]
        if own.size < promise.MIN_MEASURED_TEXTS:
            continue
        se = own.std(ddof=1) / np.sqrt(own.size)
        guard_shift = max(0.0, own.mean() - 2 * se)
        guard_scale = max(1.0, own.std(ddof=1) - 2 * own.std(ddof=1) / np.sqrt(2 * (own.size - 1)))
        judged = np.array([promise.kind_of_fraction(f) == kind for f in fractions])
        shift[judged] = guard_shift + promise.margin_for(scheme, kind, promise.MEASURED)
        scale[judged] = guard_scale
    return shift, scale


def ratio(mean: float, sd: float = 1.0) -> float:
    """The rate at z = 4 that N(mean, sd) implies, over the stated one (sd 1: the shift alone, as one reads a
    key's mean z: +0.30 is 3.4 times the stated rate)."""
    return float(special.ndtr(-(Z_THRESHOLD - mean) / max(sd, 1e-9)) / special.ndtr(-Z_THRESHOLD))


def cells(scores: dict, spec: str, mode: str, codeish: np.ndarray) -> list[dict]:
    """One row per key: n, mean and sd of the effective z, its ratio, texts flagged at z = 4 (exact test)."""
    scheme = SCHEME[spec]
    group = "yours" if mode == "measured" else "shipped"
    green, total = scores[f"{spec}/{group}_G"], scores[f"{spec}/{group}_T"]
    fraction = codeish[1::2] if mode == "measured" else codeish
    rows = []
    for k in range(green.shape[0]):
        scored = total[k] > 0
        g, t, f = green[k][scored], total[k][scored], fraction[scored]
        null = None
        if mode == "bounded":
            null = bounded_null(scheme, f)
        elif mode == "measured":
            mine_g, mine_t = scores[f"{spec}/mine_G"][k], scores[f"{spec}/mine_T"][k]
            seen = mine_t > 0
            mine_z = (mine_g[seen] - GAMMA * mine_t[seen]) / np.sqrt(mine_t[seen] * GAMMA * (1 - GAMMA))
            null = measured_null(scheme, f, codeish[0::2][seen], mine_z)
        z = effective_z(g, t, null)
        exact = special.bdtrc(g - 1, t, GAMMA)
        p_read = special.ndtr(-z)
        rows.append({"key": k, "n": int(z.size), "mean": float(z.mean()), "sd": float(z.std(ddof=1)),
                     "ratio": ratio(float(z.mean())), "ratio_with_sd": ratio(float(z.mean()), float(z.std(ddof=1))),
                     "flagged": int((np.maximum(exact, p_read) <= special.ndtr(-Z_THRESHOLD)).sum())})
    return rows


def summary(rows: list[dict]) -> dict:
    means = np.array([r["mean"] for r in rows])
    sds = np.array([r["sd"] for r in rows])
    ratios = np.array([r["ratio"] for r in rows])
    with_sd = np.array([r["ratio_with_sd"] for r in rows])
    n = int(np.median([r["n"] for r in rows]))
    noise = float(np.mean(sds) / np.sqrt(max(n, 1)))
    # the spread of z within a cell beyond the sampling noise of an sd of n texts: mean of sd^2 over keys, minus 1
    excess_var = float(np.mean(sds**2) - 1.0)
    spread = float(means.std())
    return {"n": n, "mean_of_means": float(means.mean()), "spread": spread, "noise": noise,
            "key_part": float(np.sqrt(max(spread**2 - noise**2, 0.0))), "max_mean": float(means.max()),
            "min_mean": float(means.min()), "median_sd": float(np.median(sds)), "max_sd": float(sds.max()),
            "excess_var": excess_var, "max_ratio": float(ratios.max()), "keys_over_2x": int((ratios > 2).sum()),
            "max_ratio_with_sd": float(with_sd.max()), "keys_over_2x_with_sd": int((with_sd > 2).sum()), "keys": len(rows),
            "flagged": int(sum(r["flagged"] for r in rows))}


def load(corpora: Path) -> dict:
    manifest = json.loads((corpora / "manifest.json").read_text())
    found = {}
    for name, info in manifest.items():
        path = corpora / "scores" / f"{name}.npz"
        if path.exists():
            found[name] = {"kind": info["kind"], "material": info["material"], "scores": dict(np.load(path)),
                           "codeish": codeish_fractions(corpora, name)}
    return found


def codeish_fractions(corpora: Path, name: str) -> np.ndarray:
    """Per text of the collection, the share of its tokens the kind rule counts as code (``detector.promise``)."""
    cache = corpora / "features" / f"{name}.npy"
    if cache.exists():
        return np.load(cache)

    vocab = load_vocabulary()
    texts = [json.loads(line)["text"] for line in (corpora / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    fractions = np.array([promise.codeish_fraction(vocab, np.asarray(ids, dtype=np.int64))
                          for ids in token_ids_of(vocab, texts)])
    cache.parent.mkdir(exist_ok=True)
    np.save(cache, fractions)
    return fractions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="/work/corpora")
    parser.add_argument("--out", default="benchmarks/results/key_shift_collections.json")
    parser.add_argument("--modes", default="shipped,bounded,measured")
    args = parser.parse_args(argv)
    found = load(Path(args.corpora))
    table = []
    for spec in SPECS:
        for name, item in sorted(found.items(), key=lambda kv: (kv[1]["kind"], kv[0])):
            if f"{spec}/shipped_G" not in item["scores"]:
                continue
            for mode in args.modes.split(","):
                rows = cells(item["scores"], spec, mode, item["codeish"])
                table.append({"spec": spec, "collection": name, "kind": item["kind"], "material": item["material"],
                              "held_out": name in HELD_OUT, "mode": mode, **summary(rows), "per_key": rows})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"promise": promise.describe(), "rows": table}, indent=1))
    for r in table:
        print(f"{r['spec']:11s} {r['collection']:25s} {r['kind'][:4]} {'H' if r['held_out'] else 'F'} {r['mode']:8s} "
              f"n={r['n']:4d} mean {r['mean_of_means']:+.3f} [{r['min_mean']:+.3f},{r['max_mean']:+.3f}] key part "
              f"{r['key_part']:.3f} sd {r['median_sd']:.2f} xvar {r['excess_var']:+.3f} ratio max {r['max_ratio']:5.2f} "
              f">2x {r['keys_over_2x']:2d}/{r['keys']} (with sd {r['max_ratio_with_sd']:5.1f}, "
              f"{r['keys_over_2x_with_sd']:2d}) flagged {r['flagged']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
