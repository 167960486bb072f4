"""What the evaluation's vLLM back end sends to the plugin (the vLLM run itself is in tests/vllm)."""

from __future__ import annotations

import secrets

from evaluation.vllm_generator import request_rows
from generation.sample.sampler import SamplingParams
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark

V = 49152


def test_rows_carry_spec_key_and_sampling_but_never_the_secret():
    secret = secrets.token_bytes(32)
    spec = WatermarkSpec.parse("kgw:scheme=lefthash,h=1,gamma=0.5,delta=3.0")
    marked = Watermark(spec, secret, V, key_id="k1")
    params = [SamplingParams(max_new_tokens=20, min_new_tokens=20, temperature=0.7, seed=s) for s in (1, 2)]
    rows = request_rows([[5, 6], [7]], params, [marked, None])
    assert rows[0] == {"prompt_ids": [5, 6], "max_tokens": 20, "min_tokens": 20, "temperature": 0.7, "seed": 1,
                       "extra_args": {"provmark_watermark": spec.format(), "provmark_key_id": "k1"}}
    assert rows[1]["extra_args"] == {"provmark_watermark": "off"} and rows[1]["seed"] == 2
    assert secret.hex() not in repr(rows)
