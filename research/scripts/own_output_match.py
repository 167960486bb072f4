"""How ``matches_own_output`` (``db.output_grams``) separates edited output from human text, on the real outputs
a finished ``provmark eval security`` run cached (docs/security.md):

    python research/scripts/own_output_match.py --run RUN [--edits 0.1,0.2,0.3,0.4] [--edited 400] [--per-domain 400]

Every cached generation is remembered (its prompt's 5-grams left out, as the service does); the human
texts of every shipped corpus domain (``detector.human_corpora``) and the run's own prompt corpus are
matched against all of them (the most sampled 5-grams any one text shares with one output), and the
newest ``--edited`` outputs are matched again after replacing each token with a random one at each edit
rate (``edited``), and after replacing each whitespace-separated word of their text with a word drawn from
all outputs' words (``edited_words``: a word spans about 1.3 tokens, so the same rate breaks more 5-grams).
JSON out; the edit rates' rows are what the docs quote.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

from db.output_grams import MIN_MATCHED, GramIndex, output_grams, text_grams
from detector import human_corpora
from detector.normalize import normalize
from evaluation.corpus import held_out_documents, prompt_documents
from watermark.vocab import encode, load_vocabulary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="the run's --out folder (its cache/generations.jsonl)")
    parser.add_argument("--edits", default="0.1,0.2,0.3,0.4")
    parser.add_argument("--edited", type=int, default=400, help="outputs edited at each rate (the newest)")
    parser.add_argument("--per-domain", type=int, default=400, help="human texts per corpus domain (at most)")
    args = parser.parse_args(argv)
    cache = Path(args.run) / "cache" / "generations.jsonl"
    if not cache.is_file():
        print(f"--run: no cache/generations.jsonl in {args.run}", file=sys.stderr)
        return 2
    try:
        edits = [float(r) for r in args.edits.split(",")]
        if not edits or any(not 0 <= r < 1 for r in edits) or args.edited < 1 or args.per_domain < 1:
            raise ValueError("edit rates in [0, 1), --edited and --per-domain >= 1")
    except ValueError as exc:
        print(f"bad option: {exc}", file=sys.stderr)
        return 2

    from tqdm import tqdm


    vocab, key = load_vocabulary(), 0x5EC0_0D5E
    found = [json.loads(line)["value"] for line in cache.read_text(encoding="utf-8").split("\n") if line.strip()]
    outputs = {tuple(g["token_ids"]): g for g in found if len(g.get("token_ids") or ()) > 50}  # repeats once
    index = GramIndex()
    for row, g in enumerate(tqdm(outputs.values(), desc="remembering outputs")):
        index.add(row, output_grams(g["token_ids"], g["prompt_ids"], key))

    def best(ids) -> int:
        match = index.match(text_grams(ids, key))
        return 0 if match is None else match.matched

    human: dict[str, list[str]] = {}
    for doc in human_corpora.documents():
        human.setdefault(doc.domain, [])
        if len(human[doc.domain]) < args.per_domain:
            human[doc.domain].append(doc.text[:20_000])
    human["news (the run's prompt articles)"] = [d.text for d in prompt_documents(250)]
    human["news (held-out articles)"] = [d.text for d in held_out_documents(250)]
    out = {"outputs_remembered": index.outputs, "min_matched": MIN_MATCHED, "human": {}, "edited": {}}
    for domain, texts in tqdm(human.items(), desc="human domains"):
        shared = sorted((best(encode(vocab, normalize(t).text)) for t in texts), reverse=True)
        out["human"][domain] = {"texts": len(texts), "most_shared": shared[:5],
                                "matched": int(sum(s >= MIN_MATCHED for s in shared))}
    rng = random.Random(0)
    newest = list(outputs.values())[-args.edited:]
    for rate in tqdm(edits, desc="edit rates"):
        kept = np.array([best([rng.randrange(vocab.vocab_size) if rng.random() < rate else t for t in g["token_ids"]])
                         for g in newest])
        out["edited"][f"{rate:g}"] = {"texts": len(newest), "matched": float(np.mean(kept >= MIN_MATCHED)),
                                      "shared_percentiles_1_5_50": np.percentile(kept, [1, 5, 50]).tolist()}
    words = [w for g in outputs.values() for w in g["text"].split()]
    out["edited_words"] = {}
    for rate in tqdm(edits, desc="word edit rates"):
        edited = [" ".join(rng.choice(words) if rng.random() < rate else w for w in g["text"].split()) for g in newest]
        kept = np.array([best(encode(vocab, normalize(t).text)) for t in edited])
        out["edited_words"][f"{rate:g}"] = {"texts": len(newest), "matched": float(np.mean(kept >= MIN_MATCHED)),
                                            "shared_percentiles_1_5_50": np.percentile(kept, [1, 5, 50]).tolist()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
