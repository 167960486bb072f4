"""Every text of every held-out collection (research/scripts/key_shift_corpora.py) scored under many fixed keys per spec, twice:
as a deployment that never showed the detector its texts scores them (the shipped common-unit table), and as one
that gave half of the collection through ``keys calibrate --corpus`` scores the other half (the shipped table
merged with the table of that half's common units, ``common_units.from_collections``).

    python research/scripts/key_shift_collections.py [--corpora /work/corpora] [--keys 30]
        [--specs "default;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"] [--only NAME ...]

Writes CORPORA/scores/<collection>.npz per collection (resumable: a collection already there is skipped): per spec,
the green count G and scored count T of every text under every key (``shipped_G``/``shipped_T`` [keys, texts]),
and for the split (alternate texts: even ones are the deployment's corpus A, odd ones the texts judged later B)
``yours_G``/``yours_T`` of the B texts and ``mine_G``/``mine_T`` of the A texts, both under the merged table.
Texts are normalised and tokenized as the detector does; each is scored whole. research/scripts/key_shift_table.py reads
these files. Keys: sha256("key-shift-collections/i"), i = 0 .. keys - 1, the same under every spec.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detector import common_units  # noqa: E402
from detector.calibrate import token_ids_of  # noqa: E402
from detector.scoring import score_positions  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402
from watermark.specs import parse_spec  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

SPECS = "default;kgw:scheme=lefthash,h=1;kgw:scheme=unigram"
SPEC_LABELS = {"default": "selfhash", "kgw:scheme=lefthash,h=1": "lefthash_h1", "kgw:scheme=unigram": "unigram"}


def key_secret(index: int) -> bytes:
    return hashlib.sha256(f"key-shift-collections/{index}".encode()).digest()


def read_texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def counts(mark, texts: list[torch.Tensor], table) -> tuple[np.ndarray, np.ndarray]:
    """(G, T) of every text under ``mark``, as the detector counts them (dedup, common units left out)."""
    green = np.zeros(len(texts), dtype=np.int32)
    total = np.zeros(len(texts), dtype=np.int32)
    for i, ids in enumerate(texts):
        if ids.shape[0] <= mark.context_width:
            continue
        flags, prev = score_positions(mark, ids, table)
        counted = prev < 0
        total[i] = int(counted.sum())
        green[i] = int((flags & counted).sum())
    return green, total


def score_collection(vocab, texts: list[str], specs: list[str], keys: int) -> dict[str, np.ndarray]:
    ids = [torch.tensor(t, dtype=torch.int64) for t in token_ids_of(vocab, texts)]
    half_a, half_b = ids[0::2], ids[1::2]
    yours = common_units.from_collections(vocab, [texts[0::2]])
    out: dict[str, np.ndarray] = {"tokens": np.array([t.shape[0] for t in ids], dtype=np.int32)}
    for spec_text in specs:
        spec = parse_spec(None if spec_text == "default" else spec_text)
        shipped = common_units.for_spec(spec, vocab)
        with_yours = common_units.merged(shipped, yours)
        label = SPEC_LABELS.get(spec_text, spec_text)
        found: dict[str, list[np.ndarray]] = {}
        for k in range(keys):
            mark = make_watermark(spec, key_secret(k), vocab.vocab_size)
            for name, group, table in (("shipped", ids, shipped), ("yours", half_b, with_yours),
                                       ("mine", half_a, with_yours)):
                g, t = counts(mark, group, table)
                found.setdefault(f"{label}/{name}_G", []).append(g)
                found.setdefault(f"{label}/{name}_T", []).append(t)
        out.update({name: np.stack(rows) for name, rows in found.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", default="/work/corpora")
    parser.add_argument("--keys", type=int, default=30)
    parser.add_argument("--specs", default=SPECS)
    parser.add_argument("--only", action="append", default=[])
    args = parser.parse_args(argv)
    corpora = Path(args.corpora)
    manifest = json.loads((corpora / "manifest.json").read_text())
    (corpora / "scores").mkdir(exist_ok=True)
    vocab = load_vocabulary()
    specs = args.specs.split(";")
    for name, info in manifest.items():
        target = corpora / "scores" / f"{name}.npz"
        if (args.only and name not in args.only) or target.exists():
            continue
        started = time.time()
        arrays = score_collection(vocab, read_texts(corpora / f"{name}.jsonl"), specs, args.keys)
        np.savez_compressed(target.with_suffix(".tmp.npz"), kind=info["kind"], material=info["material"],
                            keys=args.keys, **arrays)
        target.with_suffix(".tmp.npz").rename(target)
        print(f"{name}: {info['kind']}, {info['texts']} texts, {time.time() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
