"""Decode throughput with and without a JSON-schema constraint, batch 1 and 16, on the embedded model.

The engine has no constraint hook yet, so this drives the model with a plain loop (HF forward with its
own KV cache, ``logits_to_keep=1``) -> constraint masks -> sample, the same for every variant:
``plain`` (no constraint), ``json`` (masks computed inline after the forward pass) and ``json-overlap``
(masks computed on a background thread while the forward pass runs: ``start_masks``). The schema has a
long free-text field so no row completes inside the timed ``--tokens`` steps. Each figure is the median
of ``--runs`` timed runs after one warm-up; variants alternate so load from other processes hits all.

    python benchmarks/constrained.py [--runs 3] [--tokens 64] [--threads 2]

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
from generation.constraints import (
    ConstraintCompiler,
    ConstraintSpec,
    apply_constraints_,
    start_masks,
)
from generation.models import load_model

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


@torch.inference_mode()
def decode(model, prompt: list[int], batch: int, tokens: int, compiler, mode: str, seed: int) -> dict:
    """Time ``tokens`` decode steps for ``batch`` rows (prefill excluded); tokens/s and mask time."""
    constraints = [compiler.compile(ConstraintSpec(json_schema=SCHEMA)) for _ in range(batch)] if mode != "plain" else [None] * batch
    generators = [torch.Generator().manual_seed(seed + r) for r in range(batch)]
    out = model.model(input_ids=torch.tensor([prompt] * batch), use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1].float()
    mask_s = 0.0
    start = time.perf_counter()
    for step in range(tokens):
        if mode == "json":
            t = time.perf_counter()
            apply_constraints_(logits, constraints)
            mask_s += time.perf_counter() - t
        elif mode == "json-overlap" and step == 0:
            apply_constraints_(logits, constraints)
        probs = logits.softmax(-1)
        picked = [int(torch.multinomial(probs[r], 1, generator=generators[r])) for r in range(batch)]
        for c, token in zip(constraints, picked):
            if c is not None:
                c.advance(token)
        pending = start_masks(constraints, logits.shape[1]) if mode == "json-overlap" else None
        out = model.model(input_ids=torch.tensor(picked)[:, None], past_key_values=out.past_key_values,
                          use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        if pending is not None:
            t = time.perf_counter()
            pending.result().apply_(logits)  # only the wait after the forward pass counts
            mask_s += time.perf_counter() - t
    elapsed = time.perf_counter() - start
    assert not any(c is not None and c.is_complete() for c in constraints), "a row completed inside the timed steps"
    return {"tokens_per_s": batch * tokens / elapsed, "step_ms": elapsed / tokens * 1e3, "mask_ms_per_step": mask_s / tokens * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per figure (median reported)")
    parser.add_argument("--tokens", type=int, default=64, help="decode steps timed per run")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--output", type=Path, default=RESULT_PATH)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model()
    tokenizer = model.vocab.tokenizer
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True)
    prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    compiler = ConstraintCompiler(tokenizer, model.vocab.vocab_size, [model.vocab.eos_token_id])
    t = time.perf_counter()
    compiler.compile(ConstraintSpec(json_schema=SCHEMA))
    first_compile_ms = (time.perf_counter() - t) * 1e3  # tokenizer conversion + grammar, once per compiler
    modes = ("plain", "json", "json-overlap")
    results = []
    for batch in BATCHES:
        runs = {m: [] for m in modes}
        for run in range(args.runs + 1):
            for mode in modes:
                figure = decode(model, prompt, batch, args.tokens, compiler, mode, seed=100 * run)
                if run:  # run 0 warms up
                    runs[mode].append(figure)
        row = {"batch": batch}
        for mode in modes:
            row[mode] = {k: statistics.median(f[k] for f in runs[mode]) for k in runs[mode][0]}
        row["json_slowdown"] = row["plain"]["tokens_per_s"] / row["json"]["tokens_per_s"]
        row["json_overlap_slowdown"] = row["plain"]["tokens_per_s"] / row["json-overlap"]["tokens_per_s"]
        results.append(row)
    write_json("constrained", {
        "benchmark": "constrained", "library": "llguidance", "driver": "plain HF loop (engine has no constraint hook yet)",
        "tokens": args.tokens, "runs": args.runs, "first_compile_ms": first_compile_ms,
        "machine": machine(), "results": results,
    }, str(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
