"""The opt-in int8 weights (``ComputePaths(int8_weights=True)``, ``--weights int8``, ``PROVMARK_WEIGHTS=int8``):
each linear is the int8 rounding of its float32 weight with a scale per output, computed to float rounding of
that rounded model, on the default model within 1 % of float32's perplexity, and its watermarked text is
detected as float32's is."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny_llama import NATIVE_LINEARS, TINY, tiny_llama

from api.cli import main
from api.settings import Settings
from evaluation.corpus import held_out_documents
from evaluation.lm import TeacherForcedLM
from generation.cpu import decode_linear
from generation.cpu.packed_linear import PackedLinear
from generation.engine import Engine
from generation.kv_cache import CacheConfig
from generation.runner import ComputePaths, ModelRunner
from generation.sample.sampler import SamplingParams
from watermark.config import WatermarkSpec
from watermark.scheme import make_watermark
from watermark.stats import z_score
from watermark.vocab import encode

if not NATIVE_LINEARS:
    pytest.skip("no native kernels with the AVX-512 linear on this machine: no int8 weights", allow_module_level=True)



def test_quantize_int8_rounds_each_weight_to_within_half_a_step():
    weight = torch.randn(48, 70, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.01, 3, 48)[:, None]
    weight[5] = 0.0
    q, scale = decode_linear.quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.shape == (48,) and scale[5] == 1.0
    assert int(q.abs().max()) == 127
    assert bool(((q.float() * scale[:, None] - weight).abs() <= scale[:, None] / 2 * (1 + 1e-6)).all())


@pytest.mark.parametrize("rows", [1, 2, 9, 40])
def test_the_int8_linear_is_the_rounded_weights_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    weight, bias = torch.randn(96, 200, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 200, generator=gen)
    q, scale = decode_linear.quantize_int8(weight)
    got = decode_linear.Int8DecodeLinear(weight, bias)(x)
    want = torch.nn.functional.linear(x, q.float() * scale[:, None], bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_row_gives_the_same_bits_alone_as_in_a_batch():
    gen = torch.Generator().manual_seed(3)
    linear = decode_linear.Int8DecodeLinear(torch.randn(64, 96, generator=gen), torch.randn(64, generator=gen))
    x = torch.randn(5, 96, generator=gen)
    alone = torch.cat([linear(x[i:i + 1]) for i in range(5)])  # the 1-row kernel
    assert torch.equal(alone, linear(x))  # the tiles


def test_the_runner_computes_the_int8_rounded_model():
    model, rounded = tiny_llama(seed=5, tied=False), tiny_llama(seed=5, tied=False)
    rounded.load_state_dict(model.state_dict())
    with torch.no_grad():
        for module in rounded.modules():
            if isinstance(module, torch.nn.Linear):
                q, scale = decode_linear.quantize_int8(module.weight)
                module.weight.copy_(q.float() * scale[:, None])
    runner = ModelRunner(model, CacheConfig(num_blocks=16, max_model_len=128), native_kernels=True, int8_weights=True)
    prompt = torch.randint(0, TINY["vocab_size"], (30,), generator=torch.Generator().manual_seed(2)).tolist()
    first = runner.prefill([prompt], [0], [[0, 1]])
    second = runner.decode(torch.tensor([7]), [30], [[0, 1]])
    with torch.inference_mode():
        want = rounded(torch.tensor([prompt + [7]])).logits[0, -2:].float()
        plain = model(torch.tensor([prompt + [7]])).logits[0, -2:].float()
    torch.testing.assert_close(torch.cat([first, second]), want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(want, plain, rtol=1e-4, atol=1e-4)  # the rounding is visible: the check can fail
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the loaded model keeps its weights
    packed = [m for m in runner.decoder.modules() if isinstance(m, PackedLinear)] + [runner.lm_head]
    assert packed and all(m.packed_weight is None for m in packed)  # no float32 copy beside the int8 one


def test_int8_weights_on_a_bfloat16_model_are_refused():
    model = tiny_llama(torch.bfloat16)
    with pytest.raises(ValueError, match="int8 weights"):
        ModelRunner(model, CacheConfig(num_blocks=8, max_model_len=64), int8_weights=True)


def test_the_setting_takes_float_or_int8_and_names_itself_otherwise(tmp_path):
    assert Settings(home=tmp_path, weights="INT8").weights == "int8"
    assert Settings(home=tmp_path).weights == "float"
    with pytest.raises(ValueError, match="PROVMARK_WEIGHTS"):
        Settings(home=tmp_path, weights="int4")


@pytest.fixture(scope="module")
def engines(loaded):
    return Engine(loaded, max_num_seqs=4), Engine(loaded, max_num_seqs=4, paths=ComputePaths(int8_weights=True))


def perplexity(engine: Engine, loaded, ids: list[list[int]]) -> float:
    lm = TeacherForcedLM(SimpleNamespace(model=engine.runner.view, vocab=loaded.vocab))  # the engine's weights
    return math.exp(-float(np.concatenate(lm.token_logprobs(ids, [1] * len(ids))).mean()))


def test_the_default_models_perplexity_stays_within_one_percent(engines, loaded):
    ids = [encode(loaded.vocab, doc.text)[:256] for doc in held_out_documents(0)[:12]]
    full, int8 = (perplexity(engine, loaded, ids) for engine in engines)
    assert abs(int8 / full - 1) < 0.01, (full, int8)


PROMPTS = ["The history of the printing press", "def parse_config(path):", "Write a short note to a neighbour"]


def test_its_watermarked_text_is_detected(engines, loaded):
    prompt_ids = [encode(loaded.vocab, prompt) for prompt in PROMPTS]
    mark = make_watermark(WatermarkSpec.default(), b"i" * 32, loaded.vocab.vocab_size, key_id="int8")
    params = [SamplingParams(max_new_tokens=120, temperature=1.0, seed=i, ignore_eos=True) for i in range(3)]
    outs = engines[1].generate(prompt_ids[:3], params, [mark] * 3)
    for out in outs:
        flags = mark.green_flags(out.token_ids)
        assert z_score(int(flags.sum()), len(flags), WatermarkSpec.default().gamma) > 4.0


def test_the_cli_generates_on_int8_weights_and_refuses_them_on_bfloat16(loaded, monkeypatch, capsys):
    from api.cli import generate_run

    monkeypatch.setattr(generate_run, "load_model", lambda *a, **k: loaded)
    code = main(["generate", "The sea", "--weights", "int8", "--no-watermark", "--max-new-tokens", "6", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 6
    monkeypatch.undo()
    code = main(["generate", "The sea", "--weights", "int8", "--dtype", "bfloat16", "--no-watermark",
                 "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("provmark: --weights: ") and "float32" in err and err.count("\n") == 1
