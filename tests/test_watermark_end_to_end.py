"""The watermark's bar: 20 watermarked generations of 200 tokens at temperature 1.0 with the default spec
are all detected by `provmark detect` at z >= 4; 20 unwatermarked ones are not.

Unwatermarked text reaches z >= 4 with probability ~3.2e-5 per text under H0 (dedup makes the
scored units independent coins), so 20 of them all stay under with probability > 0.999.

The key is fixed as well as the sampling seeds, so the test is deterministic: with a fresh random key
per run it was not. A watermarked text at temperature 1.0 sometimes falls into a repetitive loop
that leaves ~50 distinct scored units of 200 tokens (z ~4.5 measured over 23 random keys x 20 texts),
so one run in a few dozen had one text under z 4: that is the detector's power on degenerate text,
measured in `provmark eval robustness`, not something this bar should flip on."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import torch

from generation.engine import Engine
from generation.models import load_model
from generation.sample.sampler import SamplingParams
from watermark.scheme import generation_watermark

pytestmark = pytest.mark.slow

N = 20
NEW_TOKENS = 200


def _first_sentences(n: int) -> list[str]:
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    articles = [line.strip() for line in open(path, encoding="utf-8") if line.strip()]
    return [a.split(". ")[0].strip() + "." for a in articles[:n]]


def test_watermarked_generations_are_detected_and_plain_ones_are_not(tmp_path, fixed_key):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # shared runner: see tests/test_engine.py
    try:
        loaded = load_model()
        engine = Engine(loaded, max_num_seqs=2 * N, max_model_len=512)
        wm = generation_watermark(None, engine.vocab_size)  # fixed_key: one key, like a deployment
        prompts = [engine.apply_chat_template([{"role": "user", "content": f"Continue this news story: {s}"}])
                   for s in _first_sentences(N)]
        params = [SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=1.0, seed=i)
                  for i in range(2 * N)]
        outputs = engine.generate(prompts + prompts, params, watermarks=[wm] * N + [None] * N, use_tqdm=False)
    finally:
        torch.set_num_threads(threads)
    assert all(len(o.token_ids) == NEW_TOKENS for o in outputs)
    assert all(o.watermark is not None and o.watermark.key_id == wm.key_id for o in outputs[:N])

    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("".join(json.dumps({"text": o.text}) + "\n" for o in outputs))
    cli = [sys.executable, "-c", "import sys; from api.cli import main; sys.exit(main())"]
    done = subprocess.run(cli + ["detect", "--jsonl", str(jsonl)], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=600)
    assert done.returncode == 0, done.stderr
    verdicts = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(verdicts) == 2 * N
    marked, plain = verdicts[:N], verdicts[N:]
    assert all(v["verdict"] == "watermarked" and v["z_score"] >= 4.0 for v in marked), \
        [(v["verdict"], round(v["z_score"], 2)) for v in marked]
    assert all(v["key_id"] == wm.key_id for v in marked)
    assert all(v["verdict"] != "watermarked" and v["z_score"] < 4.0 for v in plain), \
        [(v["verdict"], round(v["z_score"], 2)) for v in plain]
