"""The semantic memory at scale: lookup p50 / p99 and memory per output at 10^4, 10^5, 10^6 remembered outputs,
and what ``paraphrase_of_own_output`` costs the detector on texts that match nothing.

    python benchmarks/semantic_memory.py [--sizes 10000,100000,1000000] [--queries 2000] [--texts 40]
                                         [--rounds 5] [--remembered 20000] [--threads 2] [--out FILE]

``scale``: a detector worker's copy of one key (``db.signature_index.SignatureIndex``: an inverted index of the
outputs' signatures) filled with N synthetic signatures (``synthetic_signatures``: each output's stems drawn
independently with the fitted stems' document frequencies on human text and the model's outputs, about as many
as a 200-token output has, hashed under a key; added in one batch as a worker's first load does). Lookups:
``--queries`` asks for the best output (what a verdict asks the index for), half of them a stored output's
signature with 40 % of its stems replaced by others (as a paraphrase keeps some of its words: ``recall_at_1``
counts those whose best, after the exact comparison a partial lookup makes, is their source), half a fresh
synthetic text; p50 / p99 in ms, one at a time on one thread; ``partial_share``: lookups past the postings budget
(``db.signature_index.MAX_POSTINGS``), whose CANDIDATES best a verdict then compares exactly from the store
(timed apart here: ``rescore_ms``, in memory). ``memory_per_output_bytes``: the index's arrays over N.

``detector``: ``Detector.detect`` on held-out human passages of about 200 tokens (``detector.human_corpora``),
texts that match nothing, with the semantic memory (a SQLite store holding ``--remembered`` synthetic outputs
under the key's own hash key, read through ``SignatureMirror``) against the same detector without it, each text
both ways back to back, ``--rounds`` times; ``relative_throughput`` is the median of without / with over the
texts (``--texts 0``: not run).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine, write_json  # noqa: E402
from db.passage_signature import (  # noqa: E402
    COUNT,
    COUNT_CAP,
    HASH,
    parse,
    shipped_words,
    signature_key,
    similarity,
    stem_key,
)
from db.passage_words import fitted_words  # noqa: E402
from db.rows import OutputVectorRow, utc_now  # noqa: E402
from db.semantic_memory import SemanticMemory, SignatureMirror  # noqa: E402
from db.signature_index import SignatureIndex  # noqa: E402
from db.store import Store  # noqa: E402
from detector.human_corpora import HELD_OUT  # noqa: E402
from detector.paraphrase_match import CANDIDATES  # noqa: E402
from detector.service import Detector  # noqa: E402
from evaluation.paraphrase_calibration import passages  # noqa: E402
from watermark.keys import Keyring  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

KEY, SPEC = "bench", "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0"
STEMS = 72  # the mean number of kept stems of the embedded model's chat answers (about 250 tokens)
REPLACED = 0.4  # a paraphrase's share of new stems


def synthetic_signatures(count: int, rng: np.random.Generator, hash_key: bytes, stems: int = STEMS) -> list[bytes]:
    """``count`` signatures (``db.passage_signature`` blobs) of synthetic texts: each draws about ``stems`` kept
    stems with probabilities proportional to their document frequency (from the fitted inverse document
    frequencies), counted (at most COUNT_CAP), hashed under ``hash_key``."""
    words = fitted_words()
    key = stem_key(hash_key, words)
    kept = np.flatnonzero(key.row_kept)
    n = np.exp(words.unseen_idf - 1.0)  # idf = log((n + 1) / (df + 1)) + 1, unseen: df = 0
    df = np.maximum(n * np.exp(1.0 - words.idf[kept].astype(np.float64)) - 1.0, 0.5)
    lengths = np.maximum(rng.poisson(stems, count), 5)
    out: list[bytes] = []
    for start in range(0, count, 100_000):  # in blocks: 10^6 texts' draws at once would take gigabytes
        block = lengths[start:start + 100_000]
        rows = np.repeat(np.arange(len(block), dtype=np.int64), block)
        hashes = key.row_hashes[kept[rng.choice(len(kept), int(block.sum()), p=df / df.sum())]].astype(np.int64)
        pairs, counts = np.unique((rows << 32) | hashes, return_counts=True)
        bounds = np.searchsorted(pairs >> 32, np.arange(len(block) + 1))
        hashed = (pairs & 0xFFFFFFFF).astype(HASH)
        counted = np.minimum(counts, COUNT_CAP).astype(COUNT)
        out += [hashed[a:b].tobytes() + counted[a:b].tobytes() for a, b in zip(bounds[:-1], bounds[1:])]
    return out


def paraphrased(blob: bytes, rng: np.random.Generator, fresh: bytes) -> bytes:
    """``blob`` with a REPLACED share of its stems swapped for ``fresh``'s (another synthetic text)."""
    size = HASH.itemsize + COUNT.itemsize
    n, m = len(blob) // size, len(fresh) // size
    hashes, counts = np.frombuffer(blob, HASH, n), np.frombuffer(blob, COUNT, n, n * HASH.itemsize)
    kept = rng.random(n) >= REPLACED
    new = np.frombuffer(fresh, HASH, m)[: n - int(kept.sum())]
    merged = np.concatenate([hashes[kept], new])
    order = np.unique(merged, return_index=True)[1]
    all_counts = np.concatenate([counts[kept], np.ones(len(new), COUNT)])
    return merged[order].astype(HASH).tobytes() + all_counts[order].astype(COUNT).tobytes()


def scale(size: int, queries: int, rng: np.random.Generator) -> dict:
    hash_key = bytes(range(32))
    key = stem_key(hash_key, fitted_words())
    blobs = synthetic_signatures(size, rng, hash_key)
    parsed = [parse(b, key) for b in blobs]
    copy = SignatureIndex(keep=size)
    start = time.perf_counter()
    copy.add([(i + 1, p) for i, p in enumerate(parsed)])
    build_s = time.perf_counter() - start
    sources = rng.integers(0, size, queries // 2)
    fresh = synthetic_signatures(queries, rng, hash_key)
    asks = [parse(paraphrased(blobs[s], rng, fresh[i]), key) for i, s in enumerate(sources)]
    asks += [parse(b, key) for b in fresh[len(sources):]]
    out = {"outputs": size, "build_s": round(build_s, 2), **_lookups(copy, asks, sources, parsed),
           "queries": len(asks), "memory_per_output_bytes": round(copy.nbytes() / size, 1),
           "segments": len(copy.segments)}
    return out


def _lookups(copy: SignatureIndex, asks: list, sources: np.ndarray, parsed: list) -> dict:
    times, rescoring, hits, partial = [], [], 0, 0
    for i, query in enumerate(asks):
        t = time.perf_counter()
        found = copy.best(query, CANDIDATES)  # what a verdict asks the index for
        times.append((time.perf_counter() - t) * 1e3)
        ids = found.ids.tolist()
        if not found.exact:  # the verdict compares the candidates exactly (their signatures from the store)
            partial += 1
            t = time.perf_counter()
            scored = [(similarity(query, parsed[row - 1]), row) for row in ids]
            rescoring.append((time.perf_counter() - t) * 1e3)
            ids = [max(scored)[1]] if scored else []
        if i < len(sources) and ids and ids[0] == int(sources[i]) + 1:
            hits += 1
    times.sort()
    return {"lookup_p50_ms": round(statistics.median(times), 4),
            "lookup_p99_ms": round(times[int(0.99 * (len(times) - 1))], 4), "recall_at_1": round(hits / len(sources), 4),
            "partial_share": round(partial / len(asks), 4),
            "rescore_ms": round(statistics.median(rescoring), 4) if rescoring else None}


def detector_cost(texts: list[str], rounds: int, remembered: int, rng: np.random.Generator) -> dict:
    vocab = load_vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        keyring = Keyring(Path(tmp) / "home", master_key=hashlib.sha256(b"bench/semantic").digest())
        keyring.create(KEY, secret=hashlib.sha256(b"bench/semantic-key").digest(), spec=SPEC)
        store = Store(url=f"sqlite:///{Path(tmp) / 'store.db'}")
        store.upgrade()
        memory = SemanticMemory(store)
        hash_key = signature_key(keyring)  # the key's own: the text's stems meet the stored ones
        with store.write() as session:  # the remembered outputs, written in one transaction
            session.add_all(OutputVectorRow(key_id=KEY, receipt_id=f"r{i}", created_at=utc_now(), signature=blob)
                            for i, blob in enumerate(synthetic_signatures(remembered, rng, hash_key)))
        mirror = SignatureMirror(memory)
        with_memory = Detector(vocab=vocab, keyring=keyring, semantic_memory=mirror)
        if not mirror.wait_loaded(KEY, stem_key(hash_key, shipped_words()), timeout=600.0):  # loads beside
            raise RuntimeError("the key's copy did not load in 10 minutes")
        without = Detector(vocab=vocab, keyring=keyring)
        for detector in (with_memory, without):  # warm: tables, caches, the copy's first load
            for text in texts[:3]:
                detector.detect(text, keys=[KEY])
        assert all(not with_memory.detect(t, keys=[KEY]).paraphrase_of_own_output["matched"] for t in texts)
        ratios, spent = [], {"with": [], "without": []}
        for _ in range(rounds):
            for text in texts:
                a = _timed(lambda text=text: without.detect(text, keys=[KEY]))
                b = _timed(lambda text=text: with_memory.detect(text, keys=[KEY]))
                spent["without"].append(a)
                spent["with"].append(b)
                ratios.append(a / b)
        store.close()
    return {"texts": len(texts), "rounds": rounds, "remembered_outputs": remembered,
            "median_ms_without": round(statistics.median(spent["without"]), 4),
            "median_ms_with": round(statistics.median(spent["with"]), 4),
            "relative_throughput": round(statistics.median(ratios), 4)}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    for name, default in (("queries", 2000), ("texts", 40), ("rounds", 5), ("remembered", 20_000), ("seed", 0),
                          ("threads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if min(args.queries, args.rounds, args.remembered, args.threads) < 1 or args.texts < 0:
        parser.error("--queries, --rounds, --remembered and --threads take positive numbers, --texts 0 or more")
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rng = np.random.default_rng(args.seed)
    texts = [t for t in passages(HELD_OUT)[0] if "def " not in t][: args.texts]
    payload = {"benchmark": "semantic_memory",
               "command": "python benchmarks/semantic_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "machine": machine(), "scale": [], "detector": None}
    if texts:  # --texts 0: the index's scale only
        payload["detector"] = detector_cost(texts, args.rounds, args.remembered, rng)
        print(payload["detector"], flush=True)
    for size in sizes:
        payload["scale"].append(scale(size, args.queries, rng))
        print(payload["scale"][-1], flush=True)
    write_json("semantic_memory", payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
