"""Engine throughput with and without a JSON-schema constraint, batch 1 and 16, on the embedded model.

Each figure drives ``Engine.generate`` (prefill included) for ``batch`` copies of one chat prompt, every
row running ``--tokens`` tokens: ``plain`` rows ignore EOS, ``json`` rows carry
``SamplingParams.constraint`` with a schema whose long free-text field outlasts the run (masks computed
on the engine's background thread while the model runs). Figures are medians of ``--runs`` timed runs
after one warm-up; variants alternate so load from other processes hits both.

    python benchmarks/constrained.py [--runs 3] [--tokens 48] [--threads 1] [--batches 1,16]

Writes benchmarks/results/constrained.json and prints the same JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import machine, write_json
from generation.constraints.constraint import ConstraintSpec
from generation.engine import Engine
from generation.models import load_model
from generation.sample.sampler import SamplingParams

RESULT_PATH = ROOT / "benchmarks" / "results" / "constrained.json"
BATCHES = (1, 16)
SCHEMA = {  # an article record: short fields, then free text long enough to outlast the timed steps
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
        "body": {"type": "string", "minLength": 2000},
    },
    "required": ["title", "year", "tags", "body"],
    "additionalProperties": False,
}
PROMPT = "Write a short article about rivers as JSON with a title, year, tags and body."


def run_once(engine: Engine, prompt: list[int], batch: int, tokens: int, mode: str, seed: int) -> dict:
    """One timed ``generate`` of ``batch`` rows x ``tokens`` tokens; tokens/s over all rows."""
    constraint = ConstraintSpec(json_schema=SCHEMA) if mode == "json" else None
    params = [SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=seed + r, ignore_eos=True, constraint=constraint)
              for r in range(batch)]
    start = time.perf_counter()
    outs = engine.generate([prompt] * batch, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    if any(o.finish_reason != "length" for o in outs):
        raise RuntimeError(f"{mode}: a row ended early ({[o.finish_reason for o in outs]}): raise the schema's minLength")
    generated = sum(len(o.token_ids) for o in outs)
    return {"tokens_per_s": generated / elapsed, "seconds": elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per row")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    parser.add_argument("--output", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    engine = Engine(load_model(), max_num_seqs=max(batches), max_model_len=512)
    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT}])
    start = time.perf_counter()
    engine.constraint_compiler().compile(ConstraintSpec(json_schema=SCHEMA))
    first_compile_ms = (time.perf_counter() - start) * 1e3  # tokenizer conversion + grammar, once per engine
    modes = ("plain", "json")
    results = []
    for batch in batches:
        runs = {m: [] for m in modes}
        for run in range(args.runs + 1):
            for mode in modes:
                figure = run_once(engine, prompt, batch, args.tokens, mode, seed=100 * run)
                if run:  # run 0 warms up
                    runs[mode].append(figure)
        row = {"batch": batch}
        for mode in modes:
            row[mode] = {k: statistics.median(f[k] for f in runs[mode]) for k in runs[mode][0]}
        row["json_slowdown"] = row["plain"]["tokens_per_s"] / row["json"]["tokens_per_s"]
        results.append(row)
    write_json("constrained", {
        "benchmark": "constrained", "library": "llguidance", "driver": "Engine.generate (SamplingParams.constraint)",
        "tokens": args.tokens, "runs": args.runs, "threads": args.threads, "first_compile_ms": first_compile_ms,
        "machine": machine(), "results": results,
    }, str(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
