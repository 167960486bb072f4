"""The semantic memory at scale: lookup p50 / p99 and memory per output at 10^4, 10^5, 10^6 remembered outputs,
and what ``paraphrase_of_own_output`` costs the detector on texts that match nothing.

    python benchmarks/semantic_memory.py [--sizes 10000,100000,1000000] [--queries 2000] [--texts 40]
                                         [--rounds 5] [--remembered 20000] [--threads 2] [--expansions LIST]
                                         [--out FILE]

``scale``: a detector worker's copy of one key (``db.semantic_memory.KeyVectors``: usearch HNSW, int8, cosine,
connectivity 16, a search expansion grown with N: ``expansion_for``) filled with N synthetic vectors in the
stored form (random unit vectors, rotated and quantised as the service stores them; added in one batch as a
worker's first load does); ``--expansions``: the same lookups again at each listed expansion. Lookups:
``--queries`` searches for the CANDIDATES nearest to one vector (what a verdict asks), half of them a stored
vector with noise (cosine ~0.8 to it, as a paraphrase is: ``recall_at_1`` counts those whose nearest is their
source), half a fresh random vector; p50 / p99 in ms, one query at a time on one thread.
``memory_per_output_bytes``: usearch's own count of its memory over N.

``detector``: ``Detector.detect`` on held-out human passages of about 200 tokens (``detector.human_corpora``),
texts that match nothing, with the semantic memory (a SQLite store holding ``--remembered`` outputs under the
key, read through ``VectorMirror``) against the same detector without it, each text both ways back to back,
``--rounds`` times; ``relative_throughput`` is the median of without / with over the texts (``--texts 0``: not run).
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
from db.passage_vectors import DIM, stored_form, unit  # noqa: E402
from db.rows import OutputVectorRow, utc_now  # noqa: E402
from db.semantic_memory import EXACT_BELOW, KeyVectors, SemanticMemory, VectorMirror  # noqa: E402
from db.store import Store  # noqa: E402
from detector.human_corpora import HELD_OUT  # noqa: E402
from detector.paraphrase_match import CANDIDATES  # noqa: E402
from detector.service import Detector  # noqa: E402
from evaluation.paraphrase_calibration import passages  # noqa: E402
from watermark.keys import Keyring  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

SEED = bytes(32)
KEY, SPEC = "bench", "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0"
NOISE = 0.75  # a noisy copy: unit(v + NOISE * e) has cosine ~0.8 with v in 256 dimensions


def synthetic(count: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((count, DIM), dtype=np.int8)
    for start in range(0, count, 100_000):
        n = min(100_000, count - start)
        out[start:start + n] = stored_form(unit(rng.standard_normal((n, DIM)).astype(np.float32)), SEED)
    return out


def scale(size: int, queries: int, rng: np.random.Generator, expansions: tuple[int, ...] = ()) -> dict:
    stored = synthetic(size, rng)
    copy = KeyVectors(keep=size)
    start = time.perf_counter()
    copy.add([(i + 1, stored[i].tobytes()) for i in range(size)])
    build_s = time.perf_counter() - start
    sources = rng.integers(0, size, queries // 2)
    noisy = stored[sources].astype(np.float32) / 127.0
    noisy = unit(unit(noisy) + NOISE * unit(rng.standard_normal(noisy.shape).astype(np.float32)))
    asks = np.concatenate([_quantise(noisy), synthetic(queries - queries // 2, rng)])
    out = {"outputs": size, "build_s": round(build_s, 2), "expansion": copy.index.expansion_search,
           **_lookups(copy, asks, sources), "queries": len(asks),
           "memory_per_output_bytes": round(copy.memory_bytes() / size, 1), "exact_search": size < EXACT_BELOW}
    shipped = copy.index.expansion_search
    if expansions:  # the same index and lookups at other expansions: recall against time
        out["by_expansion"] = {}
        for expansion in expansions:
            copy.index.expansion_search = expansion
            out["by_expansion"][str(expansion)] = _lookups(copy, asks, sources)
        copy.index.expansion_search = shipped
    return out


def _lookups(copy: KeyVectors, asks: np.ndarray, sources: np.ndarray) -> dict:
    times, hits = [], 0
    for i, vector in enumerate(asks):
        t = time.perf_counter()
        found = copy.candidates(vector, CANDIDATES)  # what a verdict asks the index for
        times.append((time.perf_counter() - t) * 1e3)
        if i < len(sources) and found[0].row == int(sources[i]) + 1:
            hits += 1
    times.sort()
    return {"lookup_p50_ms": round(statistics.median(times), 4),
            "lookup_p99_ms": round(times[int(0.99 * (len(times) - 1))], 4), "recall_at_1": round(hits / len(sources), 4)}


def _quantise(vectors: np.ndarray) -> np.ndarray:
    """Vectors already in the stored space, quantised as the store keeps them (no second rotation)."""
    peak = np.abs(vectors).max(axis=1, keepdims=True)
    return np.clip(np.rint(vectors * 127.0 / peak), -127, 127).astype(np.int8)


def detector_cost(texts: list[str], rounds: int, remembered: int, rng: np.random.Generator) -> dict:
    vocab = load_vocabulary()
    with tempfile.TemporaryDirectory() as tmp:
        keyring = Keyring(Path(tmp) / "home", master_key=hashlib.sha256(b"bench/semantic").digest())
        keyring.create(KEY, secret=hashlib.sha256(b"bench/semantic-key").digest(), spec=SPEC)
        store = Store(url=f"sqlite:///{Path(tmp) / 'store.db'}")
        store.upgrade()
        memory = SemanticMemory(store)
        with store.write() as session:  # the remembered outputs, written in one transaction
            session.add_all(OutputVectorRow(key_id=KEY, receipt_id=f"r{i}", created_at=utc_now(), vector=v.tobytes())
                            for i, v in enumerate(synthetic(remembered, rng)))
        mirror = VectorMirror(memory)
        with_memory = Detector(vocab=vocab, keyring=keyring, semantic_memory=mirror)
        if not mirror.wait_loaded(KEY, timeout=600.0):  # a large memory loads beside the requests
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
    parser.add_argument("--expansions", default="", help="also look up at these search expansions (comma-separated)")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if min(args.queries, args.rounds, args.remembered, args.threads) < 1 or args.texts < 0:
        parser.error("--queries, --rounds, --remembered and --threads take positive numbers, --texts 0 or more")
    expansions = tuple(int(e) for e in args.expansions.split(",") if e.strip())
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
        payload["scale"].append(scale(size, args.queries, rng, expansions))
        print(payload["scale"][-1], flush=True)
    write_json("semantic_memory", payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
