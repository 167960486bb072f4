"""One decode step's post-processing (penalties, watermark, temperature, truncation, draw) on logits
[B, V]: provmark's LogitsPipeline against transformers' logits processors and multinomial draw.

    python benchmarks/logits_pipeline.py [--batch 16] [--repeats 30] [--threads 1] [--out FILE]

Both sides get the same logits and histories in the same process, each setting timed plain and
watermarked (ours: the default kgw spec; transformers: its WatermarkLogitsProcessor, lefthash h=1). Ours
reads each row's kind as the engine does; the watermarked rows are timed with output that reads as prose
(``delta``), as code (``code_delta``) and half of each (two groups), against the same transformers step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers.generation import logits_process as lp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import machine, parse_args, time_call, write_json  # noqa: E402
from generation.sample import LogitsPipeline, StepRows  # noqa: E402
from generation.sample.sampler import SamplerState, SamplingParams  # noqa: E402
from watermark.config import WatermarkSpec  # noqa: E402
from watermark.scheme import Watermark  # noqa: E402
from watermark.text_kind import MIN_GENERATED, codeish_table  # noqa: E402
from watermark.vocab import load_vocabulary  # noqa: E402

V = 49152  # SmolLM2's logits width
HISTORY = 128
SETTINGS = {  # name: SamplingParams fields shared by every row
    "greedy": dict(temperature=0.0),
    "top_p": dict(temperature=0.8, top_p=0.95, repetition_penalty=1.1),
    "top_k": dict(temperature=0.7, top_k=50, top_p=0.95),
}


def transformers_step(fields: dict, watermarked: bool):
    """The same step as transformers' generate() runs it: processors, warpers, then argmax or multinomial."""
    procs = lp.LogitsProcessorList()
    if fields.get("repetition_penalty", 1.0) != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(fields["repetition_penalty"]))
    if watermarked:
        procs.append(lp.WatermarkLogitsProcessor(V, "cpu", greenlist_ratio=0.25, bias=2.0, seeding_scheme="lefthash",
                                                 context_width=1))
    greedy = fields["temperature"] == 0.0
    if not greedy:
        procs.append(lp.TemperatureLogitsWarper(fields["temperature"]))
        if fields.get("top_k"):
            procs.append(lp.TopKLogitsWarper(fields["top_k"]))
        if fields.get("top_p", 1.0) < 1.0:
            procs.append(lp.TopPLogitsWarper(fields["top_p"]))

    def step(ids, logits):
        scores = procs(ids, logits.clone())
        return scores.argmax(-1) if greedy else torch.multinomial(scores.softmax(-1), 1)[:, 0]

    return step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, threads=1, batch=16, repeats=30)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (args.batch, HISTORY), generator=gen)
    logits = torch.randn(args.batch, V, generator=gen) * 3
    mark = Watermark(WatermarkSpec.default(), bytes(range(32)), V, key_id="bench")
    table = codeish_table(load_vocabulary())
    pipeline = LogitsPipeline(V, "cpu", table)
    code_tokens = [int(t) for t in table.nonzero()[0][:2 * MIN_GENERATED]]
    prose_tokens = [int(t) for t in (table == 0).nonzero()[0][1000:1000 + 2 * MIN_GENERATED]]
    rows = []
    for name, fields in SETTINGS.items():
        for watermarked, kind in ((False, None), (True, "prose"), (True, "code"), (True, "mixed")):
            states = [SamplerState(SamplingParams(seed=i, **fields), ids[i].tolist(), {0}) for i in range(args.batch)]
            for i, state in enumerate(states):  # output so far: 32 tokens that read as prose or as code
                for token in (code_tokens if kind == "code" or (kind == "mixed" and i % 2) else prose_tokens):
                    state.append(token)
            marks = [mark if watermarked else None] * args.batch
            ours = time_call(lambda: pipeline.sample(logits, StepRows.of(states, marks)), args.repeats)
            theirs = time_call(lambda step=transformers_step(fields, watermarked): step(ids, logits), args.repeats)
            rows.append({"setting": name, "watermarked": watermarked, "output_reads_as": kind,
                         "ours_ms": ours["median_ms"], "transformers_ms": theirs["median_ms"],
                         "speedup": theirs["median_ms"] / ours["median_ms"]})
            print(f"{name:7s} {'wm ' + kind if watermarked else '':9s} ours {ours['median_ms']:.2f} ms  transformers "
                  f"{theirs['median_ms']:.2f} ms  x{rows[-1]['speedup']:.1f}", file=sys.stderr)
    write_json("logits_pipeline", {"benchmark": "logits_pipeline", "vocab_size": V, "batch": args.batch,
                                   "history": HISTORY, "machine": machine(), "results": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
