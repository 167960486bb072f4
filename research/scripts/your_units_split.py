"""Do the units one collection shares, counted on half of it, take the key-to-key shift off the other half?

``provmark keys calibrate --corpus PATH`` stores a common-unit table of the user's own texts
(``detector.common_units.from_texts``, ``detector.your_units``), merged into the table every later verdict is
scored with. This measures what that buys on collections nothing was fitted on: each collection is split by
alternating texts, half A plays the user's corpus and half B the texts judged later (first ``--keep`` tokens,
at least ``--least``). Per spec, under fixed keys (sha256("provmark-key-soundness/i"), as
research/scripts/key_soundness.py), it reports the spread over keys of the mean z on B with the shipped table and with
the shipped table merged with A's, the noise of a mean of that many texts, ``key_part = sqrt(spread^2 -
noise^2)`` and the keys beyond |mean z| 0.15.

Collections: ``--package NAME`` (an installed distribution's Python files over 3 kB, its tests left out) and
``--collection NAME=PATH`` (a directory or file, read as ``keys calibrate --corpus`` reads it), repeatable.

    python research/scripts/your_units_split.py --package sqlalchemy --package transformers \\
        --collection django_docs=/path/to/django/docs [--keys 30] [--keep 800] [--least 150]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from key_soundness import BAR, mean_z

from api.cli.errors import CLIError
from api.cli.keys.corpus import read_corpus
from detector import common_units, human_corpora
from detector.your_units import scoring_table
from watermark.scheme import Watermark
from watermark.vocab import load_vocabulary

SPECS = "kgw:scheme=selfhash;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"


def package_texts(name: str) -> list[str]:
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise SystemExit(f"--package {name}: not installed")
    root = Path(found.origin).parent
    files = sorted(p for p in root.rglob("*.py")
                   if p.stat().st_size > 3000 and not {"test", "tests", "testing"} & set(p.parts))
    return [p.read_text(encoding="utf-8", errors="replace")[:20000] for p in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", action="append", default=[], metavar="NAME")
    parser.add_argument("--collection", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--specs", default=SPECS, help="spec strings separated by semicolons")
    parser.add_argument("--keep", type=int, default=800, help="tokens of each judged text")
    parser.add_argument("--least", type=int, default=150, help="judged texts need at least this many tokens")
    parser.add_argument("--out", default="benchmarks/results/your_units_split.json")
    args = parser.parse_args(argv)
    sources: dict[str, list[str]] = {name: package_texts(name) for name in args.package}
    for item in args.collection:
        name, _, path = item.partition("=")
        try:
            sources[name] = read_corpus([path])
        except CLIError as exc:
            parser.error(str(exc))
    if not sources:
        parser.error("name at least one --package or --collection")
    vocab = load_vocabulary()
    shipped = common_units.for_vocabulary(vocab)
    secrets = [hashlib.sha256(f"provmark-key-soundness/{i}".encode()).digest() for i in range(args.keys)]
    rows = []
    jobs = [(name, spec) for name in sources for spec in args.specs.split(";")]
    tables: dict[str, tuple] = {}
    for name, spec in tqdm(jobs, desc="collections x specs", unit="cell"):
        if name not in tables:
            texts = sources[name]
            yours = common_units.from_texts(vocab, texts[0::2])
            tables[name] = (scoring_table(shipped, yours), len(yours),
                            human_corpora._encoded(vocab, texts[1::2], args.keep, args.least))
        merged, entries, judged = tables[name]
        for label, table in (("shipped", shipped), ("with half A", merged)):
            means, sds, n = [], [], 0
            for secret in secrets:
                m, sd, n, _ = mean_z(Watermark(spec, secret, vocab.vocab_size), judged, table)
                means.append(m)
                sds.append(sd)
            spread, noise = float(np.std(means)), float(np.mean(sds) / np.sqrt(n))
            rows.append({"collection": name, "spec": spec, "table": label, "texts_a": len(sources[name][0::2]),
                         "your_entries": entries, "n": n, "spread": spread, "noise": noise,
                         "key_part": float(np.sqrt(max(spread**2 - noise**2, 0.0))),
                         "keys_beyond_bar": int(np.sum(np.abs(means) > BAR)), "mean_z_per_key": means})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"keys": args.keys, "keep": args.keep, "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['collection']:16s} {r['spec']:26s} {r['table']:12s} n={r['n']:4d} spread {r['spread']:.3f} "
              f"noise {r['noise']:.3f} key part {r['key_part']:.3f} beyond {BAR}: {r['keys_beyond_bar']} of {args.keys}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
