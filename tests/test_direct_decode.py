"""The direct decode step (generation/cpu/direct_decode.py) gives the module forward's bits: the same logits and
the same keys and values written into the cache, alone and in a ragged batch with a prompt chunk's rows."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import NATIVE_LINEARS, TINY, tiny_llama
from transformers import LlamaForCausalLM

from generation.cpu.direct_decode import DirectDecode
from generation.cpu.native_layers import DECODE_KERNEL_ROWS
from generation.cpu.packed_linear import packing_available
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner

if not NATIVE_LINEARS:
    pytest.skip("no native kernels with the AVX-512 decode linear on this machine: no direct decode step",
                allow_module_level=True)


def runners(dtype: torch.dtype) -> tuple[ModelRunner, ModelRunner, LlamaForCausalLM]:
    model = tiny_llama(dtype)
    if not packing_available(model):
        pytest.skip(f"oneDNN has no packed {dtype} linear on this CPU")
    config = CacheConfig(num_blocks=32, max_model_len=256)
    return (ModelRunner(model, config, native_kernels=True), ModelRunner(model, config, native_kernels=True,
                                                                         direct_decode=False), model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_direct_step_writes_and_returns_the_module_forwards_bits(dtype):
    direct, modules, model = runners(dtype)
    assert isinstance(direct.direct, DirectDecode) and modules.direct is None
    gen = torch.Generator().manual_seed(11)
    lengths = [37, 18, 5]
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    tables = [[3 * i + j for j in range(3)] for i in range(len(lengths))]  # 48 positions a row
    for runner in (direct, modules):
        runner.prefill(prompts, [0] * len(prompts), tables)
    steps = [  # (tokens, positions, tables, logit rows): alone, a ragged batch, a prompt chunk beside a decode
        ([int(torch.randint(0, 160, (1,), generator=gen))], [37], tables[:1], None),
        (torch.randint(0, 160, (3,), generator=gen).tolist(), [38, 18, 5], tables, None),
        (torch.randint(0, 160, (4,), generator=gen).tolist(), [39, 19, 20, 21], [tables[0]] + [tables[1]] * 3, [0, 3]),
    ]
    for tokens, positions, step_tables, rows in steps:
        got = direct.decode(torch.tensor(tokens), positions, step_tables, rows)
        want = modules.decode(torch.tensor(tokens), positions, step_tables, rows)
        assert torch.equal(got, want)
    for a, b in zip(direct.cache.layers, modules.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    with torch.inference_mode():  # and both are the model's own forward, to float rounding
        full = model(torch.tensor([prompts[0] + [steps[0][0][0], steps[1][0][0]]])).logits[0, -1].float()
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(direct_logits_at(direct, prompts, steps), full, rtol=tol, atol=tol)


def direct_logits_at(runner: ModelRunner, prompts, steps) -> torch.Tensor:
    """Row 0's logits after its second decoded token, recomputed from a fresh cache by the direct step."""
    fresh = ModelRunner(runner.model, CacheConfig(num_blocks=32, max_model_len=256), native_kernels=True)
    fresh.prefill(prompts[:1], [0], [[0, 1, 2]])
    fresh.decode(torch.tensor([steps[0][0][0]]), [37], [[0, 1, 2]])
    return fresh.decode(torch.tensor([steps[1][0][0]]), [38], [[0, 1, 2]])[0]


def test_a_batch_beyond_the_decode_kernels_takes_the_module_forward(monkeypatch):
    _, _, model = runners(torch.float32)
    limit = DECODE_KERNEL_ROWS[torch.float32]  # the rows the direct step takes
    direct = ModelRunner(model, CacheConfig(num_blocks=limit + 8, max_model_len=256), native_kernels=True)
    calls = []

    def refuse(self, *args):
        calls.append(args)
        raise AssertionError("the direct step ran a batch its kernels do not take")

    monkeypatch.setattr(DirectDecode, "__call__", refuse)
    rows = direct.direct.max_rows + 1
    tables = [[i] for i in range(rows)]
    direct.prefill([[1, 2]] * rows, [0] * rows, tables)
    assert direct.decode(torch.ones(rows, dtype=torch.long), [2] * rows, tables).shape == (rows, TINY["vocab_size"])
    assert calls == []
