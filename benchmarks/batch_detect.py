"""Batch detection throughput (texts/s) of ``detector.batch``: 1 and 2 local workers and a local Ray cluster.

    python benchmarks/batch_detect.py [--n 100000] [--tokens 100] [--ray-cpus 2] [--skip-ray] [--out FILE]

Texts: the Lee corpus (gensim's test data, ~60k tokens of ABC news written by people) tokenized once
and cut into ``--tokens``-token windows starting at every token offset (offset k mod the number of
offsets: beyond ~60k texts the windows repeat), decoded back to text. Cheap to make, realistic to
tokenize, and scoring costs the same whatever the verdict. Default spec (kgw selfhash h=4), one key.
Each figure is one pass, wall clock, from the prepared jobs to the verdict list in input order:
it includes the workers' start-up (spawned processes import torch and transformers; Ray actors
too). ``ray_init_s`` (starting the local cluster) is reported apart. The verdicts of every back end
are checked equal to the 1-worker run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, write_json
from detector import batch, batch_ray
from watermark.vocab import encode, load_vocabulary

CORPUS_FILE = "gensim/test/test_data/lee_background.cor"


class OneKey:
    """A keyring with one random detection key (nothing is written to disk)."""

    path = Path("/nonexistent/keyring.json")

    def __init__(self) -> None:
        self._secret = os.urandom(32)

    def __repr__(self) -> str:
        return "OneKey()"

    def detection_keys(self):
        return [type("Info", (), {"key_id": "bench"})()]

    def secret(self, key_id: str) -> bytes:
        return self._secret


def corpus_windows(vocab, count: int, tokens: int) -> list[str]:
    path = importlib.metadata.distribution("gensim").locate_file(CORPUS_FILE)
    ids = encode(vocab, " ".join(Path(str(path)).read_text(encoding="utf-8").split()))
    offsets = len(ids) - tokens
    windows = [ids[k % offsets:k % offsets + tokens] for k in range(count)]
    return vocab.tokenizer.batch_decode(windows)


def timed_run(label: str, run, prepared, reference=None) -> dict:
    started = time.perf_counter()
    verdicts = run(prepared)
    seconds = time.perf_counter() - started
    if reference is not None and verdicts != reference:
        raise SystemExit(f"{label}: verdicts differ from the 1-worker run")
    print(f"{label}: {len(verdicts)} texts in {seconds:.1f} s ({len(verdicts) / seconds:.0f} texts/s)", file=sys.stderr)
    return {"seconds": seconds, "texts_per_s": len(verdicts) / seconds, "verdicts": verdicts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="texts (default 100000)")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per text (default 100)")
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray cluster (default 2)")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args(argv)

    vocab = load_vocabulary()
    texts = corpus_windows(vocab, args.n, args.tokens)
    prepared = batch.prepare_jobs(({"text": t} for t in texts), batch.DetectOptions(), vocab=vocab, keyring=OneKey())
    results: dict = {}
    one = timed_run("1 worker", lambda p: batch.run_local(p, workers=1), prepared)
    reference = one.pop("verdicts")
    results["local_1_worker"] = one
    two = timed_run("2 workers", lambda p: batch.run_local(p, workers=2), prepared, reference)
    two.pop("verdicts")
    results["local_2_workers"] = two
    if not args.skip_ray:
        import ray

        ray_dir = tempfile.mkdtemp(prefix="pm-ray-")
        started = time.perf_counter()
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, object_store_memory=512 * 2**20,
                 _temp_dir=ray_dir, logging_level="WARNING", log_to_driver=False)
        ray_init_s = time.perf_counter() - started
        try:
            on_ray = timed_run(f"ray ({args.ray_cpus} CPUs)", lambda p: batch_ray.run_ray(p), prepared, reference)
        finally:
            ray.shutdown()
            shutil.rmtree(ray_dir, ignore_errors=True)
        on_ray.pop("verdicts")
        results["ray_local_cluster"] = {**on_ray, "cpus": args.ray_cpus, "ray_init_s": ray_init_s}
    payload = {
        "benchmark": "batch_detect",
        "command": "python benchmarks/batch_detect.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {**machine(), "load_average_1min": os.getloadavg()[0]},
        "texts": args.n,
        "tokens_per_text": args.tokens,
        "spec": prepared.jobs[0].spec,
        "keys": 1,
        "chunk_rows": batch.CHUNK_ROWS,
        "corpus": "Lee et al. 2005 (gensim test data), windows at every token offset",
        "results": results,
        "verdicts_equal_across_backends": True,
        "ray_version": importlib.metadata.version("ray") if not args.skip_ray else None,
    }
    write_json("batch_detect", payload, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
