"""The engine against llama.cpp on one workload: the same weights, prompt length, batch and forced new tokens.

    bash scripts/setup_llamacpp.sh      # once: .llamacpp/ (llama-batched-bench, llama-quantize, GGUF files)
    python benchmarks/llamacpp_throughput.py [--batches 1,16,64] [--forms f32,q8_0,bf16] [--runs 3]
        [--prompt-tokens 105] [--threads 2]

For each batch size B, every request a prompt of ``--prompt-tokens`` tokens and 128 new tokens, greedy:

- llama.cpp: ``llama-batched-bench -npp P -ntg 128 -npl B -t T -tb T`` on the embedded model's GGUF in that
  form (its prompts are B separate sequences, not one shared prefix; it decodes without sampling);
- the engine: B distinct prompts of P random tokens (prefix caching finds nothing to share), forced to 128
  new tokens, greedy, ``Engine.generate`` over all of them; ``f32`` runs the float32 model, ``bf16`` the
  bfloat16 one, ``q8_0`` the float32 model with ``ComputePaths(int8_weights=True)`` (int8 weights, a scale
  per output; llama.cpp's Q8_0 has a scale per 32 weights and quantises activations too).

Both figures are generated tokens over the whole time (prompts and generation): B * 128 / T, where T is
llama-batched-bench's ``T s`` column and the engine's wall time for the batch. (llama.cpp's own ``S t/s``
counts the prompt tokens too; it is kept in the JSON as ``llamacpp_s_t_s``.) The two alternate, run by
run, after one untimed engine run per batch; medians of ``--runs``. Writes
benchmarks/results/llamacpp_throughput.json and prints it.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json  # noqa: E402

from generation.engine import Engine  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.runner import ComputePaths  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402

LLAMACPP = ROOT / ".llamacpp"
NEW_TOKENS = 128
FORMS = {"f32": ("F32", "float32", False), "bf16": ("BF16", "bfloat16", False), "q8_0": ("Q8_0", "float32", True)}
FIRST_PLAIN_TOKEN = 100  # SmolLM2 ids below this are special/control tokens
TIMEOUT_S = 1800
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
                 r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def run_llamacpp(form: str, batch: int, prompt_tokens: int, threads: int) -> dict:
    """One llama-batched-bench run: {'seconds', 'tokens_s' (generated over total), 's_t_s' (its own figure)}."""
    gguf = LLAMACPP / "models" / f"smollm2-135m-{FORMS[form][0]}.gguf"
    binary = LLAMACPP / "build" / "bin" / "llama-batched-bench"
    if not binary.exists() or not gguf.exists():
        sys.exit(f"llamacpp_throughput: {binary} or {gguf} is missing: run `bash scripts/setup_llamacpp.sh` first")
    context = batch * (prompt_tokens + NEW_TOKENS) + 64
    command = [str(binary), "-m", str(gguf), "-c", str(context), "-npp", str(prompt_tokens), "-ntg", str(NEW_TOKENS),
               "-npl", str(batch), "-t", str(threads), "-tb", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    rows = [ROW.match(line) for line in done.stdout.splitlines()]
    rows = [m for m in rows if m]
    if done.returncode != 0 or len(rows) != 1:
        sys.exit(f"llamacpp_throughput: llama-batched-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    seconds = float(rows[0].group(9))
    return {"seconds": seconds, "tokens_s": batch * NEW_TOKENS / seconds, "s_t_s": float(rows[0].group(10))}


def run_engine(engine: Engine, prompts: list[list[int]]) -> float:
    params = SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=0.0)
    start = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert sum(len(o.token_ids) for o in outs) == NEW_TOKENS * len(prompts)
    return NEW_TOKENS * len(prompts) / elapsed


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--forms", default="f32,q8_0,bf16", help=f"comma-separated subset of {', '.join(FORMS)}")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=105)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/llamacpp_throughput.json)")
    args = parser.parse_args(argv)
    forms = [f for f in args.forms.split(",") if f]
    if any(f not in FORMS for f in forms):
        parser.error(f"--forms: choose from {', '.join(FORMS)}")
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(args.threads)
    loaded = {dtype: load_model(dtype=dtype) for dtype in {FORMS[f][1] for f in forms}}
    rng = random.Random(7)
    vocab = next(iter(loaded.values())).vocab.vocab_size
    prompts = {b: [[rng.randrange(FIRST_PLAIN_TOKEN, vocab) for _ in range(args.prompt_tokens)] for _ in range(b)]
               for b in batches}
    results = {}
    for form in forms:
        _, dtype, int8 = FORMS[form]
        engine = Engine(loaded[dtype], max_num_seqs=max(batches), max_model_len=args.prompt_tokens + NEW_TOKENS + 16,
                        prefix_caching=False, paths=ComputePaths(int8_weights=int8))
        for batch in batches:
            run_engine(engine, prompts[batch])  # untimed: first touches of the KV pool's pages, kernel warm-up
            ours, theirs = [], []
            for _ in range(args.runs):
                theirs.append(run_llamacpp(form, batch, args.prompt_tokens, args.threads))
                ours.append(run_engine(engine, prompts[batch]))
            engine_s = statistics.median(ours)
            llama_s = statistics.median(r["tokens_s"] for r in theirs)
            results[f"{form}/{batch}"] = {
                "engine_tokens_s": round(engine_s, 1), "llamacpp_tokens_s": round(llama_s, 1),
                "engine_over_llamacpp": round(engine_s / llama_s, 3),
                "engine_runs": [round(x, 1) for x in ours], "llamacpp_runs": [round(r["tokens_s"], 1) for r in theirs],
                "llamacpp_s_t_s": [r["s_t_s"] for r in theirs]}
            print(form, batch, results[f"{form}/{batch}"], flush=True)
        del engine
    report = {"benchmark": "llamacpp_throughput", "machine": machine(), "threads": args.threads,
              "prompt_tokens": args.prompt_tokens, "new_tokens": NEW_TOKENS, "runs": args.runs, "results": results}
    write_json("llamacpp_throughput", report, args.out)
    return report


if __name__ == "__main__":
    main()
