"""Does leaving out units a text repeats remove what a fixed key shifts on held-out code? (docs/detection.md)

A code base's own identifiers recur inside each of its files and across them, and no table of other text
knows them. This scores the held-out corpora (``detector.human_corpora.held_out_texts``) under fixed keys
(sha256("manykeys/i"), the keys of docs/detection.md's 30-key figures) and reports, per spec and corpus, the
key-to-key spread of the mean z, the largest |mean z|, the keys beyond 0.15 and the median counted positions,
for the shipped rule ("0") and for counting a unit only when the text holds it fewer than 2 or 3 times.
``--by token`` counts the repeats of the position's token instead of its unit (a topic word or an identifier
recurs as a token even where its units, pairs with different neighbours, do not).

    python research/scripts/repeated_units.py [--keys 30] [--specs "kgw:...;kgw:..."] [--by unit|token]
                                     [--out benchmarks/results/repeated_units.json]
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
from watermark.config import WatermarkSpec  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

SPECS = "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0;kgw:scheme=unigram,gamma=0.25,delta=2.0"
RULES = (0, 2, 3)  # 0: every first occurrence counts (shipped); r: only units the text holds fewer than r times


def text_z(mark: Watermark, ids: np.ndarray, table, by: str = "unit") -> dict[int, tuple[int, int]]:
    """Per rule, (green, counted) of one text; ``by``: what a repeat is, the position's unit or its token."""
    flags, prev, identities = score_positions(mark, torch.from_numpy(np.asarray(ids)), table, True,
                                              with_identities=True)
    if by == "token":  # scored positions are the tokens after the first h
        _, inverse, counts = np.unique(np.asarray(ids)[len(ids) - prev.shape[0]:], return_inverse=True,
                                       return_counts=True)
        repeats = counts[inverse]
    else:
        kept = prev != np.arange(prev.shape[0])  # not left out by the common-unit table
        _, inverse, counts = np.unique(identities[kept], return_inverse=True, return_counts=True)
        repeats = np.zeros(prev.shape[0], dtype=np.int64)
        repeats[kept] = counts[inverse]
    first = prev < 0
    out = {}
    for rule in RULES:
        counted = first if rule == 0 else first & (repeats < rule)
        out[rule] = (int((flags & counted).sum()), int(counted.sum()))
    return out


def corpus_row(spec: WatermarkSpec, texts: list, table, keys: int, vocab_size: int, by: str = "unit") -> dict:
    means = {rule: [] for rule in RULES}
    counted = {rule: [] for rule in RULES}
    gamma = spec.gamma
    for k in range(keys):
        mark = Watermark(spec, hashlib.sha256(f"manykeys/{k}".encode()).digest(), vocab_size, "k")
        zs = {rule: [] for rule in RULES}
        for ids in texts:
            for rule, (green, total) in text_z(mark, ids, table, by).items():
                if total:
                    zs[rule].append((green - gamma * total) / np.sqrt(total * gamma * (1 - gamma)))
                    if k == 0:
                        counted[rule].append(total)
        for rule in RULES:
            means[rule].append(float(np.mean(zs[rule])))
    row = {}
    for rule in RULES:
        m = np.array(means[rule])
        row[str(rule)] = {"sd_of_mean_z": float(m.std()), "max_abs_mean_z": float(np.abs(m).max()),
                          "keys_beyond_0.15": int((np.abs(m) > 0.15).sum()), "texts": len(counted[rule]),
                          "median_counted": float(np.median(counted[rule])) if counted[rule] else 0.0}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--specs", default=SPECS, help="spec strings separated by semicolons")
    parser.add_argument("--by", choices=("unit", "token"), default="unit", help="what a repeat is")
    parser.add_argument("--out", default="benchmarks/results/repeated_units.json")
    args = parser.parse_args(argv)
    vocab = load_vocabulary()
    corpora = human_corpora.held_out_texts(vocab)
    results = {}
    cells = [(spec_text, name) for spec_text in args.specs.split(";") for name in corpora]
    for spec_text, name in tqdm(cells, desc="spec x corpus", unit="cell"):
        spec = WatermarkSpec.parse(spec_text)
        table = common_units.for_spec(spec, vocab)
        results[f"{spec_text} | {name}"] = corpus_row(spec, corpora[name], table, args.keys, vocab.vocab_size,
                                                               args.by)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"keys": args.keys, "rules": list(RULES), "by": args.by, "results": results}, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
