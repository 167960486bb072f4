"""The decode step's layers in one native call (generation/cpu/decode_stack.py) give the Python loop's bits: the
same hidden states and the same keys and values in the cache, alone, in a ragged batch and beside a prompt chunk."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import NATIVE_LINEARS, TINY, tiny_llama

from generation.cpu.decode_stack import NativeStack
from generation.cpu.direct_decode import DirectDecode
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner

if not NATIVE_LINEARS:
    pytest.skip("no native kernels with the AVX-512 decode linear on this machine: no native stack",
                allow_module_level=True)


def step_both(dtype: torch.dtype, int8: bool = False) -> tuple[ModelRunner, ModelRunner, list]:
    """Two runners over one model, one with the native stack and one with the loop, fed the same steps."""
    model = tiny_llama(dtype)
    config = CacheConfig(num_blocks=32, max_model_len=256)
    stack, loop = (ModelRunner(model, config, native_kernels=True, int8_weights=int8) for _ in range(2))
    assert isinstance(stack.direct.stack, NativeStack)
    loop.direct = DirectDecode.of(loop.decoder, loop.cache, native_stack=False)
    assert loop.direct.stack is None
    gen = torch.Generator().manual_seed(11)
    lengths = [37, 18, 5]
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    tables = [[3 * i + j for j in range(3)] for i in range(len(lengths))]
    for runner in (stack, loop):
        runner.prefill(prompts, [0] * len(prompts), tables)
    steps = [([int(torch.randint(0, 160, (1,), generator=gen))], [37], tables[:1], None),
             (torch.randint(0, 160, (3,), generator=gen).tolist(), [38, 18, 5], tables, None),
             (torch.randint(0, 160, (4,), generator=gen).tolist(), [39, 19, 20, 21], [tables[0]] + [tables[1]] * 3,
              [0, 3])]
    results = []
    for tokens, positions, step_tables, rows in steps:
        results.append((stack.decode(torch.tensor(tokens), positions, step_tables, rows),
                        loop.decode(torch.tensor(tokens), positions, step_tables, rows)))
    return stack, loop, results


@pytest.mark.parametrize(("dtype", "int8"), [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)])
def test_the_native_stack_gives_the_python_loops_bits(dtype, int8):
    stack, loop, results = step_both(dtype, int8)
    for got, want in results:
        assert torch.equal(got, want)
    for a, b in zip(stack.cache.layers, loop.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_position_outside_its_blocks_is_refused_with_nothing_run():
    model = tiny_llama()
    runner = ModelRunner(model, CacheConfig(num_blocks=8, max_model_len=256), native_kernels=True)
    runner.prefill([[1, 2, 3]], [0], [[0]])
    hidden = runner.direct.embed(torch.tensor([[4]]))
    cos, sin = runner.direct.rotary(hidden, position_ids=torch.tensor([[99]]))
    with pytest.raises(ValueError, match="position outside"):
        runner.direct.stack(hidden, cos, sin, torch.tensor([[0]]), torch.tensor([99]))


def test_a_moved_cache_is_noticed():
    model = tiny_llama()
    runner = ModelRunner(model, CacheConfig(num_blocks=8, max_model_len=256), native_kernels=True)
    runner.prefill([[1, 2, 3]], [0], [[0]])
    runner.decode(torch.tensor([4]), [3], [[0]])
    before = runner.direct.stack._pool_at
    layer = runner.cache.layers[0]
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()  # as if the pools were reallocated
    runner.decode(torch.tensor([5]), [4], [[0]])
    assert runner.direct.stack._pool_at == layer.keys.data_ptr() != before
