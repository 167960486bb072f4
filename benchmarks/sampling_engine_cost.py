"""Engine cost of each watermark per decode step at 16 concurrent sampled requests, in one run.

    python benchmarks/sampling_engine_cost.py [--rounds 3] [--tokens 48] [--threads 2] [--out FILE]

For each setting (engine_throughput.py's sampled setting: T 0.8, top-k 50, top-p 0.95; and plain temperature 1) and
each watermark (none, the default KGW spec, gumbel:h=4, synthid:h=4, hf:synthid with 30 keys), 16 requests
(prompts of 10..200 tokens, as engine_throughput.py's) are submitted together and the engine is stepped to the end; each
decode step (every row decoding) is timed, and so is its post-processing (the LogitsPipeline, where
every watermark runs). Reported per watermark: median step and post-processing times, the step's change
against the unwatermarked step (noisy on a shared machine: the forward pass dominates), and the
watermark's own cost, its extra post-processing time as a share of the unwatermarked step. Watermarks
are interleaved round by round so machine noise hits all alike. The bar: <= 3 % of a step.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, write_json  # noqa: E402
from benchmarks.engine_throughput import BATCH, SAMPLED, make_prompts  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.sample.params import SamplingParams  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402

SECRET = hashlib.sha256(b"provmark-bench/sampling-engine").digest()
HF_SPEC = "hf:synthid,keys=" + ":".join(str(k) for k in range(101, 131)) + ",ngram_len=5"
SPECS = {"none": None, "kgw": "kgw", "gumbel": "gumbel:h=4", "synthid": "synthid:h=4", "hf:synthid": HF_SPEC}
SETTINGS = {"sampled_topk": SAMPLED, "temperature_1": {"temperature": 1.0}}


def watermark(name: str, vocab_size: int):
    spec = SPECS[name]
    if spec is None:
        return None
    if spec.startswith("hf:"):
        return make_watermark(spec, None, vocab_size)
    return make_watermark(None if spec == "kgw" else spec, SECRET, vocab_size, "bench")


def timed_postprocess(engine: Engine) -> list[float]:
    """Wrap the engine's post-processing (the LogitsPipeline, watermark included) to record its wall time
    (ms) per step: the watermark's own cost, without the forward pass's noise."""
    record: list[float] = []
    inner = engine._postprocess

    def wrapped(*args, **kwargs):
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        record.append((time.perf_counter() - start) * 1e3)
        return out

    engine._postprocess = wrapped
    return record


def decode_steps(engine: Engine, prompts, setting: dict, mark, tokens: int, post: list[float]) -> list[tuple]:
    """Step 16 requests to the end; (step ms, post-processing ms) of each step in which all rows decode."""
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, seed=i, **setting)
        engine.submit(prompt, params, mark)
    times = []
    while engine.has_unfinished():
        start = time.perf_counter()
        outs = engine.step()
        elapsed = (time.perf_counter() - start) * 1e3
        if len(outs) == len(prompts) and all(len(o.token_ids) > 1 for o in outs):
            times.append((elapsed, post[-1]))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per watermark and setting")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--specs", default=",".join(SPECS), help=f"subset of {','.join(SPECS)} (none is always run)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help=f"subset of {','.join(SETTINGS)}")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    names = ["none"] + [n for n in args.specs.split(",") if n != "none"]
    torch.set_num_threads(args.threads)
    engine = Engine(max_num_seqs=BATCH)
    prompts = make_prompts(BATCH, engine.vocab_size)
    post = timed_postprocess(engine)
    marks = {name: watermark(name, engine.vocab_size) for name in names}
    results = {}
    for setting_name in args.settings.split(","):
        setting = SETTINGS[setting_name]
        for name, mark in marks.items():  # warm-up: kernels built, PRF caches and compiles done
            decode_steps(engine, prompts, setting, mark, 4, post)
        samples: dict[str, list[tuple]] = {name: [] for name in marks}
        for _ in range(args.rounds):
            for name, mark in marks.items():
                samples[name].extend(decode_steps(engine, prompts, setting, mark, args.tokens, post))
                print(f"{setting_name} {name}: median step {statistics.median(s for s, _ in samples[name]):.1f} ms",
                      file=sys.stderr)
        step = {name: statistics.median(s for s, _ in v) for name, v in samples.items()}
        postprocess = {name: statistics.median(p for _, p in v) for name, v in samples.items()}
        results[setting_name] = {
            name: {"decode_step_ms": round(step[name], 2), "postprocess_ms": round(postprocess[name], 2),
                   "steps": len(samples[name]),
                   "step_vs_unwatermarked_pct": round(100 * (step[name] - step["none"]) / step["none"], 2),
                   # the watermark's own cost: its extra post-processing time over the unwatermarked step
                   "postprocess_cost_pct_of_step": round(100 * (postprocess[name] - postprocess["none"])
                                                         / step["none"], 2)}
            for name in samples}
    write_json("sampling_engine_cost", {"machine": machine(), "batch": BATCH, "tokens": args.tokens,
                                        "rounds": args.rounds, "specs": {n: SPECS[n] for n in names},
                                        "settings": {n: SETTINGS[n] for n in args.settings.split(",")},
                                        "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
