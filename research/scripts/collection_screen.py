"""Does screening a key on one half of a collection keep its null on the other half? (docs/detection.md)

``provmark keys create --corpus`` and ``keys calibrate --corpus`` measure a key on texts the user holds, in the
hope that they share with the texts the key will later judge what no shipped corpus knows (a code base's
identifiers, a news desk's topics, a licence's wording). This splits each held-out collection of
``detector.human_corpora`` into two halves by alternating documents: half A plays the user's corpus, half B the
texts judged later. Per spec and collection, under fixed keys (sha256("collection-screen/i")), it reports the
correlation over keys of the mean z on A and on B, the spread of the mean z on B over all keys and over the keys
that pass the screen's rule on A (``detector.calibration``: |mean z| more than SCREEN_SHIFT from 0 after two
standard errors fails), and how many keys of each group are beyond 0.15 on B.

    python research/scripts/collection_screen.py [--keys 60] [--specs "kgw:...;kgw:..."] [--out benchmarks/results/collection_screen.json]
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
from detector.calibrate import token_ids_of, window_z  # noqa: E402
from detector.calibration import GUARD_SIGMAS, SCREEN_SHIFT  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402
from watermark.specs import parse_spec  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

SPECS = "kgw:scheme=selfhash;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"
BAR = 0.15
KEEP = 1500  # tokens of each document, as the held-out code of research/scripts/key_soundness.py


def collections(vocab) -> dict[str, list[list[int]]]:
    """Held-out collections of at least 100 texts, each text's first KEEP token ids (normalised and tokenized
    as the detector does): the standard library's source, the news, the reviews, the licences, and the
    encyclopedia's paragraphs (41 articles)."""
    held = human_corpora.documents(split=human_corpora.HELD_OUT)
    groups = {"stdlib code": [d.text for d in held if d.collection == "stdlib"],
              "news": [d.text for d in held if d.domain == "news"],
              "reviews": [d.text for d in held if d.domain == "reviews"],
              "licences": [d.text for d in held if d.domain == "boilerplate"],
              "encyclopedia paragraphs": [p for d in held if d.domain == "encyclopedia" for p in d.text.split("\n\n")
                                          if len(p.split()) >= 40]}
    return {name: [ids[:KEEP] for ids in token_ids_of(vocab, texts)] for name, texts in groups.items()}


def mean_z(mark, texts: list[torch.Tensor], common) -> tuple[float, float, int]:
    zs = [z for total, z in (window_z(mark, ids, common) for ids in texts) if total]
    return float(np.mean(zs)), float(np.std(zs, ddof=1)), len(zs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=60)
    parser.add_argument("--specs", default=SPECS, help="spec strings separated by semicolons")
    parser.add_argument("--out", default="benchmarks/results/collection_screen.json")
    args = parser.parse_args(argv)
    vocab = load_vocabulary()
    found = collections(vocab)
    rows = []
    cells = [(spec_text, name) for spec_text in args.specs.split(";") for name in found]
    for spec_text, name in tqdm(cells, desc="spec x collection", unit="cell"):
        spec = parse_spec(spec_text)
        common = common_units.for_spec(spec, vocab)
        texts = [torch.tensor(ids, dtype=torch.int64) for ids in found[name]]
        half_a, half_b = texts[0::2], texts[1::2]
        on_a, on_b, passes = [], [], []
        for k in range(args.keys):
            mark = make_watermark(spec, hashlib.sha256(f"collection-screen/{k}".encode()).digest(), vocab.vocab_size)
            mean_a, sd_a, n_a = mean_z(mark, half_a, common)
            mean_b, _, _ = mean_z(mark, half_b, common)
            on_a.append(mean_a)
            on_b.append(mean_b)
            passes.append(n_a < 2 or abs(mean_a) - GUARD_SIGMAS * sd_a / np.sqrt(n_a) <= SCREEN_SHIFT)
        on_a, on_b, passes = np.array(on_a), np.array(on_b), np.array(passes)
        kept = on_b[passes]
        rows.append({"spec": spec_text, "collection": name, "texts_a": len(half_a), "texts_b": len(half_b),
                     "correlation_a_b": float(np.corrcoef(on_a, on_b)[0, 1]),
                     "spread_b_all": float(on_b.std()), "beyond_bar_b_all": int((np.abs(on_b) > BAR).sum()),
                     "keys_passing_a": int(passes.sum()),
                     "spread_b_passing": float(kept.std()) if kept.size else None,
                     "beyond_bar_b_passing": int((np.abs(kept) > BAR).sum())})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"keys": args.keys, "screen_shift": SCREEN_SHIFT, "rows": rows}, indent=1) + "\n")
    for r in rows:
        print(f"{r['spec']:26s} {r['collection']:24s} A/B {r['texts_a']:4d}/{r['texts_b']:4d} "
              f"corr {r['correlation_a_b']:+.2f}  B spread all {r['spread_b_all']:.3f} "
              f"(beyond {r['beyond_bar_b_all']} of {args.keys})  passing A: {r['keys_passing_a']}, B spread "
              f"{r['spread_b_passing'] if r['spread_b_passing'] is None else round(r['spread_b_passing'], 3)} "
              f"(beyond {r['beyond_bar_b_passing']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
