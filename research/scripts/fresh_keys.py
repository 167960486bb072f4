"""Fresh keys judged as a user meets them: through the CLI, on human texts of your choosing.

Per spec, a fresh keyring (a temporary ``PROVMARK_HOME``) gets ``--keys`` keys from ``provmark keys create`` (screened,
as a user's are), and ``provmark detect --jsonl CORPUS --key ID`` scores every corpus under each key. Reported per
key and corpus: the mean and sd of z, its standard error, the human texts flagged and the 99 % binomial bound on
that count at the stated rate; per spec and corpus, the keys whose |mean z| is beyond 0.15.

With ``--your-texts`` each corpus is split by alternating lines: the keys are created with one ``--corpus`` per corpus,
its first half (the deployment's own texts, one path per collection: screened on them, and their common units
stored), and only the second halves are judged.

    python research/scripts/fresh_keys.py --corpus paragraphs=P.jsonl --corpus code=C.jsonl [--keys 6] [--your-texts]
        [--specs "default;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"] [--out benchmarks/results/fresh_keys.json]

Each corpus is a JSONL file of {"text": ...} lines (other fields are ignored), as ``provmark detect --jsonl`` reads.
Each (spec, corpus, key) row is also appended to OUT with the suffix ``.rows.jsonl`` as soon as it is measured.

Per key and corpus also what the promise is judged on: the verdicts' own p-values (the p-value a verdict gives where its
promise or guard raised it, ``promise.raised`` / ``calibration.guarded``, else the binomial mid-p of its counts), as
normal quantiles, their mean, and the false-positive rate at z = 4 that mean implies over the stated one
(``judged_ratio``; within 2x while the mean is at most 0.1525); and which promise the verdicts carried.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from scipy.stats import binom, norm
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from api.cli.detect import parse_record
from api.cli.errors import CLIError
from watermark.stats import Z_THRESHOLD, p_value_normal

SPECS = "default;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"
BAR = 0.15  # |mean z| of one key on one corpus beyond which the key is off (3.4x the stated rate at +0.30)
CLI = [sys.executable, "-m", "api.cli"]


def run(args: list[str], home: Path) -> str:
    found = subprocess.run(CLI + args, check=False, env=dict(os.environ, PROVMARK_HOME=str(home)), capture_output=True,
                           text=True, cwd=Path(__file__).resolve().parents[2])
    if found.returncode != 0:
        raise SystemExit(f"provmark {' '.join(args)}: exit {found.returncode}\n{found.stderr[-2000:]}")
    return found.stdout


def read_lines(path: Path) -> list[str]:
    """The non-empty lines of a JSONL corpus, each checked as ``provmark detect-batch`` checks a record."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        try:
            parse_record(line, str(path), number)
        except CLIError as exc:
            raise SystemExit(str(exc)) from None
    return lines


def judged_z(verdicts: list[dict]) -> np.ndarray:
    """The normal quantile of each scored verdict's p-value as the promise is judged on it: the verdict's own where its promise
    or guard raised it, else the binomial mid-p of its counts."""
    found = []
    for v in verdicts:
        total, green = v.get("num_tokens_scored") or 0, v.get("num_green_tokens")
        if not total or green is None:
            continue
        raised = (v.get("promise") or {}).get("raised") or (v.get("calibration") or {}).get("guarded")
        p = v["p_value"] if raised else binom.sf(green, total, 0.25) + 0.5 * binom.pmf(green, total, 0.25)
        found.append(-norm.ppf(max(p, 1e-300)))
    return np.array(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", action="append", default=[], metavar="NAME=PATH.jsonl", required=True)
    parser.add_argument("--keys", type=int, default=6)
    parser.add_argument("--specs", default=SPECS, help="spec strings separated by semicolons (default: the default spec)")
    parser.add_argument("--your-texts", action="store_true", help="create the keys with --corpus on half of each corpus")
    parser.add_argument("--out", default="benchmarks/results/fresh_keys.json")
    args = parser.parse_args(argv)
    alpha = p_value_normal(Z_THRESHOLD)
    with tempfile.TemporaryDirectory(prefix="provmark-fresh-keys-") as scratch:
        scratch = Path(scratch)
        corpora, yours = {}, []  # yours: one --corpus path per corpus
        for item in args.corpus:
            name, _, path = item.partition("=")
            if not path or not Path(path).is_file():
                parser.error(f"--corpus {item}: expected NAME=PATH to a JSONL file")
            lines = read_lines(Path(path))
            if args.your_texts:
                yours.append(scratch / f"yours-{name}.jsonl")
                yours[-1].write_text("\n".join(lines[0::2]) + "\n", encoding="utf-8")
                lines = lines[1::2]
            corpora[name] = scratch / f"{name}.jsonl"
            corpora[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
        specs = args.specs.split(";")
        rows = []
        partial = Path(args.out).with_suffix(".rows.jsonl")
        partial.unlink(missing_ok=True)
        progress = tqdm(total=len(specs) * args.keys * (1 + len(corpora)), desc="keys create / detect", unit="run")
        for spec in specs:
            home = scratch / f"home-{len(rows)}"
            keys = []
            for i in range(args.keys):
                extra = ([] if spec == "default" else ["--spec", spec]) + [
                    item for path in yours for item in ("--corpus", str(path))]
                run(["keys", "create", f"fresh{i}", "--no-progress", "--json", *extra], home)
                keys.append(f"fresh{i}")
                progress.update()
            for name, path in corpora.items():
                for key in keys:
                    verdicts = [json.loads(line) for line in run(["detect", "--jsonl", str(path), "--key", key], home)
                                .splitlines() if line.strip()]
                    z = np.array([v["z_score"] for v in verdicts if v.get("z_score") is not None], dtype=float)
                    z = z[np.isfinite(z)]
                    flagged = sum(v.get("verdict") == "watermarked" for v in verdicts)
                    judged = judged_z(verdicts)
                    rows.append({"spec": spec, "corpus": name, "key": key, "texts": len(verdicts), "scored": int(z.size),
                                 "mean_z": float(z.mean()), "sd_z": float(z.std()), "se": float(z.std() / math.sqrt(z.size)),
                                 "flagged": int(flagged), "bound99": int(binom.ppf(0.99, len(verdicts), alpha)),
                                 "judged_n": int(judged.size), "judged_mean_z": float(judged.mean()),
                                 "judged_ratio": float(norm.sf(4.0 - judged.mean()) / norm.sf(4.0)),
                                 "promises": dict(Counter(f"{(v.get('promise') or {}).get('promise')}/"
                                                          f"{(v.get('promise') or {}).get('kind')}" for v in verdicts))})
                    partial.parent.mkdir(parents=True, exist_ok=True)
                    with partial.open("a", encoding="utf-8") as rows_so_far:  # a long run's cells as they come
                        rows_so_far.write(json.dumps(rows[-1]) + "\n")
                    progress.update()
        progress.close()
    for r in rows:
        print(f"{r['spec']:26s} {r['corpus']:12s} {r['key']:7s} n={r['scored']:5d} mean z {r['mean_z']:+.3f} "
              f"(se {r['se']:.3f}) sd {r['sd_z']:.3f} flagged {r['flagged']} (99% bound {r['bound99']}) judged mean "
              f"{r['judged_mean_z']:+.3f} ratio {r['judged_ratio']:.2f} {r['promises']}")
    summary = {}
    for r in rows:
        cell = summary.setdefault(f"{r['spec']} / {r['corpus']}", {"keys": 0, "beyond_bar": 0, "max_abs_mean_z": 0.0,
                                                                  "max_judged_ratio": 0.0, "judged_cells_over_2x": 0})
        cell["keys"] += 1
        cell["max_judged_ratio"] = max(cell["max_judged_ratio"], r["judged_ratio"])
        cell["judged_cells_over_2x"] += r["judged_ratio"] > 2 and r["judged_n"] >= 200
        cell["beyond_bar"] += abs(r["mean_z"]) > BAR
        cell["max_abs_mean_z"] = max(cell["max_abs_mean_z"], abs(r["mean_z"]))
    for name, cell in summary.items():
        print(f"{name:42s} keys beyond |mean z| {BAR}: {cell['beyond_bar']} of {cell['keys']}, "
              f"max {cell['max_abs_mean_z']:.3f}; judged ratio max {cell['max_judged_ratio']:.2f}, cells of 200+ "
              f"texts over 2x: {cell['judged_cells_over_2x']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"your_texts": args.your_texts, "keys": args.keys, "rows": rows, "summary": summary},
                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
