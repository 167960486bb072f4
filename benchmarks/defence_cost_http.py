"""What the detector's defences cost a client of the service: POST /v1/detect over real HTTP, as gunicorn runs it.

``benchmarks/detector_throughput.py`` times the detection core in one process (a 1,000-token verdict in about
0.9 ms), where the defences' 0.05-0.15 ms are 5-15 % of it. A caller of the service pays more per verdict than
the core: HTTP, the JSON, the token check, the provenance lookup and the stored verdict (a write in the audit
chain). This benchmark measures the defences against that, the throughput a user of the service gets.

Four detector services run side by side on loopback (``provmark serve detector``, gunicorn, ``--workers``
workers, SQLite in their own ``PROVMARK_HOME``), taking turns round by round so a burst of load on the machine
hits all of them alike:

- ``bare``: a key of the default spec and no remembered output: the own-output match has nothing to search
  and the spoof check an empty table (a service that has written nothing yet);
- ``memory``: the same key (the same keyring and master key) with ``--outputs`` remembered outputs in its
  store: every verdict runs the own-output match, every positive the spoof check against the counts;
- ``two_part``: a two-part key of the default spec: every text is scored under both halves, and the paired
  test runs (``detector.two_part``);
- ``budget``: the ``bare`` service's keyring with the per-token detection budget on (``db.budget``: every
  verdict charged, the charges batched per worker into the shared table); the others run without one;
- ``semantic_off``: a copy of the ``memory`` service's home and store with the semantic memory off
  (``PROVMARK_SEMANTIC_OUTPUTS=0``). The ``memory`` service also remembers ``--signatures`` outputs' words under
  the key (synthetic signatures under the key's own hash key, their stems drawn with the fitted stems' document
  frequencies: ``benchmarks.semantic_memory.synthetic_signatures``), so every verdict of it reads the text's
  stems and scores them against every remembered output for ``paraphrase_of_own_output``;
  ``relative_to_semantic_off`` is what the semantic memory costs (``benchmarks/semantic_memory.py`` times it in
  one process).

Every request carries a ``detect``-scope token (what a user holds; ``explain`` tokens are not budgeted).

Texts of ``--tokens`` tokens: each service's positives written with its key's bias over the Lee corpus's words
(``benchmarks.detector_throughput.watermarked_rows``, no model needed; a two-part key's both halves, as
generation biases them) and human windows of the same corpus. Each round sends every service (each one first
in turn) its positives, then the negatives, ``--requests`` of each at ``--concurrency`` client threads (the
clients run on the same machine: their time is part of every request alike). Reported per service and phase:
the best and the median requests/s over ``--rounds`` rounds, the median latency, and the ratio to ``bare``
(the defence's cost is one minus it). Writes benchmarks/results/defence_cost_http.json.

    python benchmarks/defence_cost_http.py [--rounds 5] [--requests 64] [--concurrency 2] [--outputs 1000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.detector_throughput import watermarked_rows, word_pool  # noqa: E402
from benchmarks.service_load import free_port, human_texts, load_phase, post, stop, wait_ready  # noqa: E402
from watermark.config import WatermarkSpec  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

SERVICES = ("bare", "memory", "two_part", "budget", "semantic_off")
NO_BUDGET, LARGE_BUDGET = "0", str(10**15)  # PROVMARK_DETECT_BUDGET: 0 is none; the other is never reached
PHASES = ("positives", "negatives")
KEY_ID = "bench"


def remember_outputs(home: Path, vocab, outputs: int) -> None:
    """``outputs`` remembered 200-token outputs of ``home``'s key in its store, through the service's own path
    (``output_null_z``, then ``OutputMemory.record``); they need no bias: what is timed is the lookups."""
    from db.output_grams import gram_key, output_grams
    from db.output_memory import OutputMemory
    from db.store import Store, database_url
    from detector import common_units
    from detector.service import Detector
    from detector.spoof_check import output_null_z
    from watermark.keys import Keyring

    keyring = Keyring(home)
    mark = Detector(vocab=vocab, keyring=keyring).watermarks(WatermarkSpec.default())[0]
    common = common_units.for_spec(mark.spec, vocab)
    grams_key = gram_key(keyring)
    pool, weights = word_pool(vocab)
    store = Store(url=database_url(home))
    store.upgrade()
    memory = OutputMemory(store)
    gen = torch.Generator().manual_seed(1)
    try:
        for _ in tqdm(range(outputs), desc="remembered outputs", unit="output"):
            ids = pool[torch.multinomial(weights, 200, replacement=True, generator=gen)]
            z, identities = output_null_z(mark, ids, common, memory)
            memory.record(mark.key_id, identities, z, output_grams(ids.numpy(), None, grams_key))
    finally:
        store.close()


def remember_signatures(home: Path, count: int) -> None:
    """``count`` synthetic outputs' signatures under ``home``'s key, hashed under its keyring's key
    (``db.passage_signature.signature_key``), written in one transaction as the generation service writes them
    one by one."""
    import numpy as np

    from benchmarks.semantic_memory import synthetic_signatures
    from db.passage_signature import signature_key
    from db.rows import OutputVectorRow, utc_now
    from db.store import Store, database_url
    from watermark.keys import Keyring

    blobs = synthetic_signatures(count, np.random.default_rng(2), signature_key(Keyring(home)))
    store = Store(url=database_url(home))
    try:
        store.upgrade()
        with store.write() as session:
            session.add_all(OutputVectorRow(key_id=KEY_ID, receipt_id=f"bench-{i}", created_at=utc_now(),
                                            signature=blob) for i, blob in enumerate(blobs))
    finally:
        store.close()


def wait_for_semantic_copies(url: str, text: str, token: str, workers: int, timeout: float = 600.0) -> None:
    """Until every worker of the service answers with its semantic copy loaded (a large one loads beside the
    requests, and until then a verdict's ``paraphrase_of_own_output`` is None): 4 x ``workers`` answers in a row."""
    deadline, in_a_row = time.monotonic() + timeout, 0
    while in_a_row < 4 * workers:
        if time.monotonic() > deadline:
            raise RuntimeError("the memory service's workers did not load their semantic copies in time")
        answer = post(url, {"text": text}, token)[2] or {}
        loaded = answer.get("paraphrase_of_own_output") is not None
        in_a_row = in_a_row + 1 if loaded else 0
        if not loaded:
            time.sleep(0.5)


def detect_token(home: Path) -> str:
    """A ``detect``-scope API token in ``home``'s store (the store made and migrated here when new)."""
    from db.api_tokens import create_token
    from db.store import Store, database_url

    store = Store(url=database_url(home))
    try:
        store.upgrade()
        return create_token(store, ["detect"], "defence-cost-benchmark")[1]
    finally:
        store.close()


def positive_texts(home: Path, vocab, count: int, tokens: int) -> list[str]:
    """``count`` texts of ``tokens`` words drawn with the bias of ``home``'s key (all positives)."""
    from detector.service import Detector
    from watermark.keys import Keyring

    mark = Detector(vocab=vocab, keyring=Keyring(home)).watermarks(WatermarkSpec.default())[0]
    pool, weights = word_pool(vocab)
    return [vocab.tokenizer.decode(ids) for ids in watermarked_rows(mark, pool, weights, count, tokens, 2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64, help="requests per phase and round")
    parser.add_argument("--texts", type=int, default=16, help="distinct texts per phase (sent in turn)")
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=2, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers per service")
    parser.add_argument("--outputs", type=int, default=1000, help="remembered outputs of the memory service")
    parser.add_argument("--signatures", type=int, default=20000,
                        help="remembered outputs' signatures of the memory service")
    parser.add_argument("--out", help="output JSON path (default benchmarks/results/defence_cost_http.json)")
    args = parser.parse_args(argv)
    from watermark.keys import Keyring

    root = Path(tempfile.mkdtemp(prefix="provmark-defences-"))
    homes = {name: root / name for name in SERVICES}
    env = {key: value for key, value in os.environ.items()
           if key not in ("PROVMARK_DATABASE_URL", "PROVMARK_MASTER_KEY", "PROVMARK_HOME")}
    env.update(PROVMARK_RATE_LIMIT="0", TOKENIZERS_PARALLELISM="false")
    vocab = load_vocabulary()
    Keyring(homes["bare"]).create(KEY_ID, spec=WatermarkSpec.default())
    for name in ("memory", "budget"):  # the same keyring and master key, before any store
        shutil.copytree(homes["bare"], homes[name])
    Keyring(homes["two_part"]).create(KEY_ID, spec=WatermarkSpec.default(), public_half=True)
    remember_outputs(homes["memory"], vocab, args.outputs)
    remember_signatures(homes["memory"], args.signatures)
    shutil.copytree(homes["memory"], homes["semantic_off"])  # the same keyring, master key and store
    tokens = {name: detect_token(homes[name]) for name in SERVICES}
    negatives = human_texts(args.tokens, args.texts)
    texts = {name: {"positives": positive_texts(homes[name], vocab, args.texts, args.tokens), "negatives": negatives}
             for name in SERVICES}
    bodies = {name: {phase: [{"text": texts[name][phase][i % args.texts]} for i in range(args.requests)]
                     for phase in PHASES} for name in SERVICES}

    children, urls = {}, {}
    rates = {name: {phase: [] for phase in PHASES} for name in SERVICES}
    latencies = {name: {phase: [] for phase in PHASES} for name in SERVICES}
    verdicts = {}
    try:
        for name in SERVICES:
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}/v1/detect"
            children[name] = subprocess.Popen(
                [sys.executable, "-m", "api.cli", "serve", "detector", "--port", str(port),
                 "--workers", str(args.workers)],
                cwd=ROOT, stdout=subprocess.DEVNULL, env={
                    **env, "PROVMARK_HOME": str(homes[name]),
                    "PROVMARK_DETECT_BUDGET": LARGE_BUDGET if name == "budget" else NO_BUDGET,
                    "PROVMARK_SEMANTIC_OUTPUTS": "0" if name == "semantic_off" else str(10**6)})
            wait_ready(f"http://127.0.0.1:{port}", children[name], name)
        for name in SERVICES:  # warm-up: every worker loads its tables and (memory) the key's memory
            for phase in PHASES:
                load_phase(urls[name], bodies[name][phase], tokens[name], args.concurrency * 2)
        wait_for_semantic_copies(urls["memory"], texts["memory"]["negatives"][0], tokens["memory"], args.workers)
        for name in SERVICES:
            verdicts[name] = {phase: [post(urls[name], {"text": t}, tokens[name])[2] for t in texts[name][phase]]
                              for phase in PHASES}
        for round_ in tqdm(range(args.rounds), desc="rounds", unit="round"):
            turn = round_ % len(SERVICES)
            for name in SERVICES[turn:] + SERVICES[:turn]:  # each service first in turn
                for phase in PHASES:
                    summary, _ = load_phase(urls[name], bodies[name][phase], tokens[name], args.concurrency)
                    if summary["errors"]:
                        raise RuntimeError(f"{name} {phase}: {summary['errors']} requests failed "
                                           f"({summary['error_statuses']})")
                    rates[name][phase].append(summary["requests_per_s"])
                    latencies[name][phase].append(summary["p50_ms"])
    finally:
        stop(children.values())
        shutil.rmtree(root, ignore_errors=True)

    def shown(name: str, phase: str) -> dict:
        runs = rates[name][phase]
        found = verdicts[name][phase]
        row = {"requests_per_s_best": max(runs), "requests_per_s_median": statistics.median(runs),
               "runs": runs, "p50_ms_median": statistics.median(latencies[name][phase]),
               "watermarked": sum(v["verdict"] == "watermarked" for v in found),
               "spoof_checked": sum(v.get("spoof_suspected") is not None for v in found),
               "own_output_answered": sum(v.get("matches_own_output") is not None for v in found)}
        if name != "bare":
            row["relative_to_bare_best"] = max(runs) / max(rates["bare"][phase])
            row["relative_to_bare_median"] = statistics.median(runs) / statistics.median(rates["bare"][phase])
            row["extra_p50_ms"] = row["p50_ms_median"] - statistics.median(latencies["bare"][phase])
        if name == "memory":
            row["relative_to_semantic_off_median"] = (statistics.median(runs)
                                                      / statistics.median(rates["semantic_off"][phase]))
            row["relative_to_semantic_off_best"] = max(runs) / max(rates["semantic_off"][phase])
            row["paraphrase_answered"] = sum(v.get("paraphrase_of_own_output") is not None for v in found)
        return row

    payload = {"benchmark": "defence_cost_http", "machine": machine(),
               "command": "python benchmarks/defence_cost_http.py " + " ".join(argv if argv is not None else sys.argv[1:]),
               "tokens": args.tokens, "requests": args.requests, "rounds": args.rounds, "texts": args.texts,
               "concurrency": args.concurrency, "workers": args.workers, "remembered_outputs": args.outputs,
               "remembered_signatures": args.signatures,
               "services": {name: {phase: shown(name, phase) for phase in PHASES} for name in SERVICES}}
    write_json("defence_cost_http", payload, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
