"""Does greedy output stay token for token with transformers in each dtype? The default-dtype measurement.

16 short prompts (instructions and code, no chat template), 64 new tokens, greedy: the engine runs them as
one batch; transformers' ``generate`` runs each alone (no padding). Per dtype, how many of the 16 outputs are
identical (over the shorter of the two, when one stops early); then how many the engine's bfloat16 and
float32 outputs share, and their common prefix lengths.

    python benchmarks/dtype_agreement.py [--threads 2] [--new-tokens 64]

Writes benchmarks/results/dtype_agreement.json and prints the same JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from common import machine, write_json

from generation.engine import Engine
from generation.models import load_model
from generation.sample.sampler import SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper.", "Explain how a hash table works.", "def fibonacci(n):",
    "The history of the printing press", "List five uses for baking soda.",
    "Translate to French: The cat sleeps on the mat.", "What causes the seasons on Earth?",
    "Write a Python function that reverses a linked list.", "Summarize the plot of Hamlet.",
    "Give me a recipe for pancakes.", "Why is the sky blue?", "Describe the water cycle.",
    "import numpy as np\n\ndef softmax(x):", "Write a haiku about autumn.",
    "What is the difference between TCP and UDP?", "Tell me about the Roman Empire.",
]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def same(a: list[int], b: list[int]) -> bool:
    return common_prefix(a, b) == min(len(a), len(b))


def outputs(dtype: str, new_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """The engine's greedy outputs (one batch) and transformers' (one prompt at a time)."""
    loaded = load_model(dtype=dtype)
    engine = Engine(loaded, max_num_seqs=len(PROMPTS), max_model_len=512)
    ids = [engine.prompt_ids(p) for p in PROMPTS]
    params = [SamplingParams(max_new_tokens=new_tokens, temperature=0.0) for _ in ids]
    ours = [list(o.token_ids) for o in engine.generate(ids, params, use_tqdm=False)]
    theirs = []
    with torch.inference_mode():
        for p in ids:
            out = loaded.model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                        max_new_tokens=new_tokens, do_sample=False,
                                        pad_token_id=loaded.vocab.eos_token_id or 0)
            theirs.append(out[0, len(p):].tolist())
    return ours, theirs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {"benchmark": "dtype_agreement", "machine": machine(), "prompts": len(PROMPTS),
              "new_tokens": args.new_tokens, "engine_equals_transformers": {}}
    engine_out = {}
    for dtype in ("float32", "bfloat16"):
        ours, theirs = outputs(dtype, args.new_tokens)
        engine_out[dtype] = ours
        report["engine_equals_transformers"][dtype] = sum(same(a, b) for a, b in zip(ours, theirs))
    pairs = list(zip(engine_out["bfloat16"], engine_out["float32"]))
    report["bfloat16_equals_float32"] = sum(same(a, b) for a, b in pairs)
    report["bfloat16_float32_common_prefix"] = [common_prefix(a, b) for a, b in pairs]
    path = write_json("dtype_agreement", report, args.output)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
