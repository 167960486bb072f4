"""Speculative decoding with prompt lookup vs plain decoding on an input-grounded task, same run.

Task: "Rewrite the following passage in your own words" + a news article from the Lee corpus (gensim's
test data), chat template, greedy, up to 128 new tokens. Arms, interleaved per run so load from other
processes hits all of them: the engine (``Engine.generate``), the speculative loop with no drafter
(plain decoding on the same private-cache loop), and prompt lookup with k = 5 (the default) and k = 3.
``--draft-model`` adds a draft-model arm (k = 3). Greedy outputs are checked token-identical across arms.
Figures are medians over passages x runs of tokens/s; acceptance rate is accepted / proposed drafts over all runs.

    python benchmarks/speculative.py [--runs 3] [--passages 3] [--threads 2] [--new-tokens 128]

Writes benchmarks/results/speculative.json and prints the same JSON.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
from pathlib import Path

# Sleeping (not spinning) OpenMP workers (see benchmarks/engine_throughput.py). Before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, write_json
from generation.decoding.speculative.decode import speculative_decode
from generation.decoding.speculative.drafters import (
    ModelDrafter,
    NoDrafter,
    PromptLookupDrafter,
    load_draft_model,
)
from generation.engine import Engine
from generation.models import load_model
from generation.sample.sampler import SamplingParams

NEW_TOKENS = 128
WARMUP_TOKENS = 8  # one short untimed run per arm
INSTRUCTION = "Rewrite the following passage in your own words:\n\n"
FIRST_ARTICLE = 1  # article 0 is 316 words; 1, 3, 4 are ~150 words (~200 tokens)
LOOKUP = {"max_ngram": 3, "min_ngram": 1}  # SpeculativeConfig's defaults


def passages(count: int) -> list[str]:
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    with open(path, encoding="utf-8") as lines:
        articles = [line.strip() for line in lines if line.strip()]
    short = [a for a in articles[FIRST_ARTICLE:] if 100 <= len(a.split()) <= 200]
    return short[:count]


def arms(engine: Engine, params: SamplingParams, draft_model: str | None = None) -> dict:
    """name -> fn(prompt ids) -> (output token ids, seconds, stats or None)."""

    def engine_arm(ids):
        start = time.perf_counter()
        out = engine.generate([ids], params, use_tqdm=False)[0]
        return out.token_ids, time.perf_counter() - start, None

    def loop_arm(drafter_factory, k):
        def run(ids):
            start = time.perf_counter()
            out = speculative_decode(engine, ids, params, drafter_factory(), k)
            return out.token_ids, time.perf_counter() - start, out.decoding_stats
        return run

    def lookup():
        return PromptLookupDrafter(LOOKUP["max_ngram"], LOOKUP["min_ngram"])

    found = {
        "engine": engine_arm,
        "plain_loop": loop_arm(NoDrafter, 1),
        "prompt_lookup_k5": loop_arm(lookup, 5),
        "prompt_lookup_k3": loop_arm(lookup, 3),
    }
    if draft_model is not None:
        drafter_net = load_draft_model(draft_model, engine.loaded)
        found["draft_model_k3"] = loop_arm(lambda: ModelDrafter(drafter_net), 3)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs per passage and arm")
    parser.add_argument("--passages", type=int, default=3, help="Lee corpus articles used as passages")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--draft-model", default=None,
                        help="also time a draft-model arm (a local HF folder sharing the tokenizer, or 'default')")
    parser.add_argument("--output", default=None)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.passages < 1:
        parser.error("--runs and --passages must be >= 1")
    torch.set_num_threads(args.threads)
    engine = Engine(load_model(), max_num_seqs=1, max_model_len=1024)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    prompts = [engine.apply_chat_template([{"role": "user", "content": INSTRUCTION + p}]) for p in passages(args.passages)]
    fns = arms(engine, params, args.draft_model)
    for fn in arms(engine, SamplingParams(max_new_tokens=WARMUP_TOKENS, temperature=0.0), args.draft_model).values():
        fn(prompts[0])  # warm-up: allocator, kernels, tokenizer
    speeds: dict[str, list[float]] = {name: [] for name in fns}
    counts = {name: {"proposed": 0, "accepted": 0, "target_forwards": 0, "tokens": 0} for name in fns}
    identical = True
    for _ in range(args.runs):
        for ids in prompts:
            outputs = {}
            for name, fn in fns.items():
                tokens, seconds, stats = fn(ids)
                outputs[name] = tokens
                speeds[name].append(len(tokens) / seconds)
                counts[name]["tokens"] += len(tokens)
                if stats is not None:
                    for key in ("proposed", "accepted", "target_forwards"):
                        counts[name][key] += stats[key]
            identical &= all(t == outputs["engine"] for t in outputs.values())
    base = statistics.median(speeds["engine"])
    results = {}
    for name in fns:
        c = counts[name]
        results[name] = {
            "tokens_per_s_median": round(statistics.median(speeds[name]), 2),
            "tokens_per_s_runs": [round(s, 2) for s in speeds[name]],
            "speedup_vs_engine": round(statistics.median(speeds[name]) / base, 3),
            "speedup_vs_plain_loop": round(statistics.median(speeds[name]) / statistics.median(speeds["plain_loop"]), 3),
            "acceptance_rate": round(c["accepted"] / c["proposed"], 3) if c["proposed"] else None,
            "tokens_per_target_forward": round(c["tokens"] / c["target_forwards"], 3) if c["target_forwards"] else None,
            **({k: c[k] for k in ("proposed", "accepted", "target_forwards", "tokens")} if name != "engine" else {"tokens": c["tokens"]}),
        }
    payload = {
        "benchmark": "speculative",
        "task": f"greedy, {INSTRUCTION.strip()!r} + Lee corpus article, chat template, <= {args.new_tokens} new tokens",
        "passages": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "runs": args.runs,
        "greedy_outputs_identical_across_arms": identical,
        "results": results,
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "command": "python benchmarks/speculative.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    write_json("speculative", payload, args.output)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
