"""The engine at scale: prefix caching, time to first token, a long prompt arriving into running decodes, KV
memory per token, and throughput at 16 and 64 concurrent requests against transformers in the same run.

    python benchmarks/engine_workloads.py [--threads 2] [--repeats 5] [--skip-transformers] [--only=NAME ...]

Workloads (SmolLM2-135M-Instruct, float32, greedy unless said):
- chat: 32 requests sharing a ~500-token system prompt, each its own question, 32 new tokens, all submitted
  at once; tokens/s (prompt + generated, over the wall time) with prefix caching on and off, and the share
  of prompt tokens found cached.
- ttft: one ~520-token prompt alone; time to its first token with its prefix cached (all but the question
  computed before) and uncached (prefix caching off), p50 of ``--repeats``.
- arrival: 16 requests decoding (prompts of 40 tokens); time between their tokens p50/p99 over 260 steps,
  without and with a 2,000-token prompt submitted at the window's start (its whole chunked prefill).
- short arrival: the same 16 decodes, their time between tokens over the 40 steps from a 200-token prompt's
  arrival on, without it, with it chunked beside them (every prompt is) and with it prefilled whole (a
  prefill-only step, the former rule for prompts up to 1,024 tokens); medians of ``--repeats`` alternated runs.
- memory: 64 requests of 100..300-token prompts running at once; pool bytes held (whole blocks) per token in
  use, against the raw key + value bytes of one token.
- throughput: 16 and 64 concurrent greedy requests (benchmarks/engine_throughput.py's prompts, 64 new
  tokens forced) against transformers ``generate`` over the same prompts.

Writes benchmarks/results/engine_workloads.json and prints the same JSON.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import engine_throughput  # noqa: E402
from common import machine, parse_args, write_json  # noqa: E402

from generation import scheduler  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.kv_cache import kv_bytes_per_token  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402

FIRST_PLAIN_TOKEN = 100
SYSTEM_TOKENS = 500
# steps timed in the arrival workload: the whole chunked prefill of the 2,000-token prompt beside 16
# decodes (8 prompt tokens a step: 250 steps) and a few more
ARRIVAL_WINDOW = 260
# steps timed in the short-arrival workload: the 200-token prompt's chunks (8 tokens a step: 25 steps) and more;
# short enough that one prefill-only step (16 gaps of 640) reaches the p99
SHORT_WINDOW = 40


def plain_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(FIRST_PLAIN_TOKEN, vocab) for _ in range(n)]


def greedy(new: int, forced: bool = False) -> SamplingParams:
    return SamplingParams(max_new_tokens=new, min_new_tokens=new if forced else 0, temperature=0.0)


def chat(loaded, vocab: int) -> dict:
    rng = random.Random(7)
    system = plain_tokens(rng, SYSTEM_TOKENS, vocab)
    prompts = [system + plain_tokens(rng, 20, vocab) for _ in range(32)]
    out = {}
    for caching in (True, False):
        engine = Engine(loaded, max_num_seqs=32, max_model_len=1024, prefix_caching=caching)
        engine.generate(prompts[:1], greedy(2), use_tqdm=False)  # warm-up (its system prompt is forgotten below)
        engine = Engine(loaded, max_num_seqs=32, max_model_len=1024, prefix_caching=caching)
        start = time.perf_counter()
        outs = engine.generate(prompts, greedy(32, forced=True), use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(p) + len(o.token_ids) for p, o in zip(prompts, outs))
        blocks = engine.scheduler.blocks
        out["on" if caching else "off"] = {"wall_s": round(wall, 3), "tokens_per_s": round(tokens / wall, 1),
                                          "generated_per_s": round(32 * 32 / wall, 1),
                                          "prefix_hit_rate": round(blocks.hit_rate, 4)}
    out["speedup_on_vs_off"] = round(out["on"]["tokens_per_s"] / out["off"]["tokens_per_s"], 2)
    return out


def first_token_s(engine: Engine, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.submit(prompt, greedy(1))
    while engine.has_unfinished():
        engine.step()
    return time.perf_counter() - start


def ttft(loaded, vocab: int, repeats: int) -> dict:
    rng = random.Random(8)
    cached_engine = Engine(loaded, max_num_seqs=4, max_model_len=1024)
    cold_engine = Engine(loaded, max_num_seqs=4, max_model_len=1024, prefix_caching=False)
    system = plain_tokens(rng, SYSTEM_TOKENS, vocab)
    first_token_s(cached_engine, system + plain_tokens(rng, 20, vocab))  # warm-up, and the system prompt cached
    first_token_s(cold_engine, system + plain_tokens(rng, 20, vocab))
    cached, uncached = [], []
    for _ in range(repeats):
        prompt = system + plain_tokens(rng, 20, vocab)
        cached.append(first_token_s(cached_engine, prompt))
        uncached.append(first_token_s(cold_engine, prompt))
    c, u = statistics.median(cached), statistics.median(uncached)
    return {"prompt_tokens": SYSTEM_TOKENS + 20, "cached_p50_ms": round(c * 1e3, 1),
            "uncached_p50_ms": round(u * 1e3, 1), "cached_over_uncached": round(c / u, 3), "repeats": repeats}


def decode_gaps(engine: Engine, prompts: list[list[int]], arrival: list[int] | None, steps: int) -> list[float]:
    """Seconds between consecutive tokens of the 16 running requests over ``steps`` steps after they all decode;
    ``arrival`` (if any) is submitted at the window's start."""
    ids = {engine.submit(p, greedy(steps + 40, forced=True)) for p in prompts}
    last: dict[str, float] = {}
    while len(last) < len(ids):  # until every request has its first token
        for out in engine.step():
            last[out.request_id] = time.perf_counter()
    if arrival is not None:
        engine.submit(arrival, greedy(1))
    gaps = []
    for _ in range(steps):
        for out in engine.step():
            if out.request_id in ids:
                now = time.perf_counter()
                gaps.append(now - last[out.request_id])
                last[out.request_id] = now
    for rid in ids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return gaps


def arrival(loaded, vocab: int) -> dict:
    rng = random.Random(9)
    prompts = [plain_tokens(rng, 40, vocab) for _ in range(16)]
    long_prompt = plain_tokens(rng, 2000, vocab)
    engine = Engine(loaded, max_num_seqs=32, max_model_len=2304)
    decode_gaps(engine, prompts[:2], None, 5)  # warm-up
    out = {}
    for name, extra in (("without", None), ("with_2000_token_arrival", long_prompt)):
        gaps = sorted(decode_gaps(engine, prompts, extra, ARRIVAL_WINDOW))
        out[name] = {"tbt_p50_ms": round(statistics.median(gaps) * 1e3, 1),
                     "tbt_p99_ms": round(gaps[int(0.99 * (len(gaps) - 1))] * 1e3, 1), "gaps": len(gaps)}
    out["p99_ratio"] = round(out["with_2000_token_arrival"]["tbt_p99_ms"] / out["without"]["tbt_p99_ms"], 2)
    return out


def arrival_short(loaded, vocab: int, repeats: int) -> dict:
    """A 200-token prompt arriving into 16 decodes: their time between tokens over the SHORT_WINDOW steps from
    the arrival on, without it, with it (chunked beside the decodes) and with it prefilled whole (the rule for
    prompts of up to 1,024 tokens before every prompt was chunked), the three alternated ``repeats`` times;
    medians of each run's p50 / p99 / max."""
    rng = random.Random(11)
    prompts = [plain_tokens(rng, 40, vocab) for _ in range(16)]
    engine = Engine(loaded, max_num_seqs=32, max_model_len=1024)
    decode_gaps(engine, prompts[:2], None, 5)  # warm-up
    runs: dict[str, list[dict]] = {"without": [], "with_200_token_arrival": [], "with_it_prefilled_whole": []}
    for i in range(repeats):
        for name in runs:
            extra = None if name == "without" else plain_tokens(random.Random(100 + i), 200, vocab)
            scheduler.CHUNKED_PREFILL_ABOVE = 1024 if name == "with_it_prefilled_whole" else 0
            try:
                gaps = sorted(decode_gaps(engine, prompts, extra, SHORT_WINDOW))
            finally:
                scheduler.CHUNKED_PREFILL_ABOVE = 0
            runs[name].append({"tbt_p50_ms": statistics.median(gaps) * 1e3,
                               "tbt_p99_ms": gaps[int(0.99 * (len(gaps) - 1))] * 1e3, "tbt_max_ms": gaps[-1] * 1e3})
    out = {name: {key: round(statistics.median(r[key] for r in rs), 1) for key in rs[0]} for name, rs in runs.items()}
    for name in ("with_200_token_arrival", "with_it_prefilled_whole"):
        out[name]["p99_ratio"] = round(statistics.median(
            w["tbt_p99_ms"] / o["tbt_p99_ms"] for w, o in zip(runs[name], runs["without"])), 2)
    out.update(window_steps=SHORT_WINDOW, repeats=repeats, load_average=[round(x, 2) for x in os.getloadavg()])
    return out


def memory(loaded, vocab: int) -> dict:
    rng = random.Random(10)
    prompts = [plain_tokens(rng, rng.randrange(100, 301), vocab) for _ in range(64)]
    engine = Engine(loaded, max_num_seqs=64, max_model_len=512)
    for p in prompts:
        engine.submit(p, greedy(8, forced=True))
    running = engine.scheduler.running
    while engine.has_unfinished() and (len(running) < 64 or any(s.num_cached < len(s.prompt_ids) for s in running)):
        engine.step()
    engine.step()
    sequences = len(running)
    in_use = sum(s.num_tokens for s in running)
    held = engine.scheduler.blocks.num_used * engine.runner.cache.block_nbytes
    raw = kv_bytes_per_token(loaded.model.config, torch.float32)
    while engine.has_unfinished():
        engine.step()
    return {"sequences": sequences, "tokens_in_use": in_use, "pool_bytes_held": held,
            "bytes_per_token": round(held / in_use, 1), "raw_kv_bytes_per_token": raw,
            "overhead": round(held / in_use / raw - 1, 4), "pool_bytes_reserved": engine.runner.cache.nbytes,
            "block_size": engine.runner.cache.config.block_size}


def throughput(loaded, vocab: int, pad_id: int, skip_transformers: bool) -> dict:
    out = {}
    for batch in (16, 64):
        prompts = engine_throughput.make_prompts(batch, vocab)
        engine = Engine(loaded, max_num_seqs=batch, max_model_len=512)
        engine.generate(prompts[:2], greedy(4), use_tqdm=False)  # warm-up
        start = time.perf_counter()
        outs = engine.generate(prompts, greedy(64, forced=True), use_tqdm=False)
        ours = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start)
        row = {"engine_tokens_per_s": round(ours, 1)}
        if not skip_transformers:
            theirs = run_transformers_n(loaded.model, prompts, pad_id)
            row.update(transformers_tokens_per_s=round(theirs, 1), speedup=round(ours / theirs, 2))
        out[f"concurrent_{batch}"] = row
    return out


def run_transformers_n(model, prompts, pad_id: int) -> float:
    """transformers generate over the prompts, 64 new tokens forced (the module's constant is what it reads)."""
    saved, engine_throughput.NEW_TOKENS = engine_throughput.NEW_TOKENS, 64
    try:
        return engine_throughput.run_transformers(model, prompts, False, pad_id)
    finally:
        engine_throughput.NEW_TOKENS = saved


def main(argv: list[str] | None = None) -> dict:
    extra = list(sys.argv[1:] if argv is None else argv)
    skip = "--skip-transformers" in extra
    only = [a.split("=", 1)[1] for a in extra if a.startswith("--only=")]
    args = parse_args(__doc__, [a for a in extra if a != "--skip-transformers" and not a.startswith("--only=")],
                      threads=2, repeats=5)
    loaded = load_model()
    vocab = int(loaded.model.config.vocab_size)
    pad_id = loaded.vocab.eos_token_id
    workloads = {
        "chat_32_shared_system_prompt": lambda: chat(loaded, vocab),
        "ttft_lone_prompt": lambda: ttft(loaded, vocab, args.repeats),
        "arrival_into_16_decodes": lambda: arrival(loaded, vocab),
        "short_arrival_into_16_decodes": lambda: arrival_short(loaded, vocab, args.repeats),
        "kv_memory_at_64": lambda: memory(loaded, vocab),
        "throughput_greedy": lambda: throughput(loaded, vocab, pad_id, skip),
    }
    unknown = set(only) - set(workloads)
    if unknown:
        raise SystemExit(f"engine_workloads: no workload {sorted(unknown)}; choose from {sorted(workloads)}")
    result = {"benchmark": "engine_workloads", "command": "python benchmarks/engine_workloads.py " + " ".join(extra),
              "machine": machine(), "model": "SmolLM2-135M-Instruct", "dtype": "float32"}
    result.update({name: run() for name, run in workloads.items() if not only or name in only})
    write_json("engine_workloads", result, args.out)
    return result


if __name__ == "__main__":
    main()
