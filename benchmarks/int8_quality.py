"""What the opt-in int8 weights cost in quality: perplexity on held-out text and the watermark's z-scores.

    python benchmarks/int8_quality.py [--docs 60] [--tokens 512] [--texts 32] [--new-tokens 200]

The default model in float32 and with ``ComputePaths(int8_weights=True)``, side by side:

- perplexity over the first ``--tokens`` tokens of ``--docs`` held-out documents (evaluation.corpus, the
  documents no prompt is drawn from), every position's logits through the engine's own view of the model;
- ``--texts`` continuations of ``--new-tokens`` tokens, sampled (temperature 1, seed per text) under the
  default spec with a throwaway key, 40-token prompts from other held-out documents, scored as the detector
  scores them (n-gram dedup): median and lowest z, and how many reach z > 4.

Writes benchmarks/results/int8_quality.json and prints it.
"""

from __future__ import annotations

import argparse
import math
import secrets
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json  # noqa: E402

from detector.scoring import counted_positions, score_positions  # noqa: E402
from evaluation.corpus import held_out_documents  # noqa: E402
from evaluation.lm import TeacherForcedLM  # noqa: E402
from generation.engine import Engine  # noqa: E402
from generation.models import load_model  # noqa: E402
from generation.runner import ComputePaths  # noqa: E402
from generation.sample.sampler import SamplingParams  # noqa: E402
from watermark.config import WatermarkSpec  # noqa: E402
from watermark.scheme import make_watermark  # noqa: E402
from watermark.stats import z_score  # noqa: E402
from watermark.vocab import encode  # noqa: E402


def perplexity(engine: Engine, loaded, rows: list[list[int]]) -> float:
    """Perplexity of ``rows`` through the engine's own view of the model (the weights its steps run)."""
    lm = TeacherForcedLM(SimpleNamespace(model=engine.runner.view, vocab=loaded.vocab))
    return math.exp(-float(np.concatenate(lm.token_logprobs(rows, [1] * len(rows))).mean()))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=60)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="the JSON result (default benchmarks/results/int8_quality.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model()
    engines = {"float32": Engine(loaded, max_num_seqs=16),
               "int8": Engine(loaded, max_num_seqs=16, paths=ComputePaths(int8_weights=True))}
    documents = held_out_documents(0)
    rows = [encode(loaded.vocab, d.text)[: args.tokens] for d in documents[: args.docs]]
    spec = WatermarkSpec.default()
    mark = make_watermark(spec, secrets.token_bytes(32), loaded.vocab.vocab_size, key_id="int8-quality")
    prompts = [encode(loaded.vocab, d.text)[:40] for d in documents[args.docs: args.docs + args.texts]]
    params = [SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    results = {}
    for name, engine in engines.items():
        zs = []
        for out in engine.generate(prompts, params, [mark] * len(prompts), use_tqdm=False):
            flags, prev = score_positions(mark, torch.tensor(out.token_ids))
            counted = np.asarray(flags)[counted_positions(prev)]
            zs.append(z_score(int(counted.sum()), len(counted), spec.gamma))
        results[name] = {"perplexity": round(perplexity(engine, loaded, rows), 4), "z_median": round(statistics.median(zs), 2),
                         "z_lowest": round(min(zs), 2), "z_above_4": sum(z > 4 for z in zs)}
    report = {"benchmark": "int8_quality", "machine": machine(), "docs": len(rows),
              "tokens_scored": sum(len(r) - 1 for r in rows), "texts": len(prompts), "new_tokens": args.new_tokens,
              "results": results,
              "perplexity_ratio": round(results["int8"]["perplexity"] / results["float32"]["perplexity"], 4)}
    write_json("int8_quality", report, args.out)
    return report


if __name__ == "__main__":
    main()
