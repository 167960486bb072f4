"""The engine on a CUDA device (skipped without one; benchmarks/gpu_check.sh runs this file on a GPU):
greedy output equals transformers' ``generate`` token for token, CUDA-graph replay equals the eager decode,
prefill and the block-table attention equal the CPU path. What a CPU can test of the same code is in
tests/test_gpu_path.py."""

from __future__ import annotations

import pytest
import torch

from generation.engine import Engine
from generation.gpu.paged_attention import block_table_attention
from generation.kv_cache import CacheConfig
from generation.models import load_model
from generation.runner import ModelRunner
from generation.sample.sampler import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NEW_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):",
    "List three prime numbers and explain, step by step, why each of them is prime. Be brief but precise:",
]
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
LOGIT_TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 0.15}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cuda_loaded(request):
    return load_model(device="cuda", dtype=request.param)


@pytest.fixture(scope="module")
def cpu_loaded():
    return load_model(device="cpu", dtype="float32")


def prompt_ids(loaded) -> list[list[int]]:
    return [loaded.vocab.tokenizer(p)["input_ids"] for p in PROMPTS]


@torch.inference_mode()
def reference(loaded, ids: list[int]) -> list[int]:
    x = torch.tensor([ids], device=loaded.device)
    y = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False)
    return y[0, len(ids):].tolist()


def test_the_engine_runs_the_cuda_path(cuda_loaded):
    engine = Engine(cuda_loaded, max_num_seqs=8, max_model_len=256)
    runner = engine.runner
    assert runner.device.type == "cuda" and runner.block_table_attention and runner.graphs is not None
    assert not runner.native_attention and not runner.packed_weights


def test_greedy_alone_matches_transformers_token_for_token(cuda_loaded):
    engine = Engine(cuda_loaded, max_num_seqs=8, max_model_len=256)
    for ids in prompt_ids(cuda_loaded):
        (out,) = engine.generate([ids], GREEDY, use_tqdm=False)
        assert out.token_ids == reference(cuda_loaded, ids)
    assert engine.runner.graphs.replays > 0


def test_greedy_batch_matches_transformers_token_for_token(cuda_loaded):
    if cuda_loaded.dtype != torch.float32:
        pytest.skip("a batch's bf16 matmuls need not round as one row's do: exactness is checked in float32")
    engine = Engine(cuda_loaded, max_num_seqs=8, max_model_len=256)
    ids = prompt_ids(cuda_loaded)
    outs = engine.generate(ids, GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outs] == [reference(cuda_loaded, i) for i in ids]


def decode_steps(runner, prompts, tables, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    runner.prefill(prompts, [0] * len(prompts), tables)
    positions, out = [len(p) for p in prompts], []
    for _ in range(steps):
        tokens = torch.randint(100, 40000, (len(prompts),), generator=gen).to(runner.device)
        out.append(runner.decode(tokens, positions, tables).cpu())
        positions = [p + 1 for p in positions]
    return out


def test_graph_replay_equals_the_eager_decode(cuda_loaded):
    config = CacheConfig(num_blocks=64, max_model_len=256)
    eager = ModelRunner(cuda_loaded.model, config, cuda_graphs=False)
    graphed = ModelRunner(cuda_loaded.model, config, cuda_graphs=True)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (5, 40, 17)]
    tables = [[30, 4, 11, 1], [7, 22, 2, 41], [5, 19, 9, 60]]  # shuffled blocks, rows of different lengths
    want = decode_steps(eager, prompts, tables, 4, seed=1)
    got = decode_steps(graphed, prompts, tables, 4, seed=1)
    assert all(static.graph is not None for static in graphed.graphs.batches.values())
    tolerance = LOGIT_TOLERANCE[cuda_loaded.dtype]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=tolerance, rtol=tolerance)
        assert torch.equal(g.argmax(-1), w.argmax(-1))


def test_prefill_and_decode_equal_the_cpu_path(cuda_loaded, cpu_loaded):
    if cuda_loaded.dtype != torch.float32:
        pytest.skip("compared with the CPU in float32")
    config = CacheConfig(num_blocks=64, max_model_len=256)
    cpu = ModelRunner(cpu_loaded.model, config)
    cuda = ModelRunner(cuda_loaded.model, config)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in (70, 3, 33)]
    tables = [[8, 3, 12, 50, 6], [1, 2], [9, 40, 7]]
    with torch.inference_mode():
        want = cpu.prefill(prompts, [0, 0, 0], tables)
        got = cuda.prefill(prompts, [0, 0, 0], tables).cpu()
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)
    tokens = torch.tensor([500, 600, 700])
    positions = [len(p) for p in prompts]
    want = cpu.decode(tokens, positions, tables)
    got = cuda.decode(tokens.cuda(), positions, tables).cpu()
    torch.testing.assert_close(got, want, atol=2e-3, rtol=2e-3)


def test_block_table_attention_on_cuda_equals_the_cpu():
    gen = torch.Generator().manual_seed(3)
    keys, values = torch.randn(40, 3, 16, 64, generator=gen), torch.randn(40, 3, 16, 64, generator=gen)
    query = torch.randn(4, 9, 1, 64, generator=gen)
    tables = torch.randperm(40, generator=gen)[:12].view(4, 3)
    tables[:, 0] = tables[0, 0]  # a block shared by every row
    lengths = torch.tensor([1, 48, 17, 30])
    want = block_table_attention(query, keys, values, tables, lengths, 0.125)
    got = block_table_attention(*(t.cuda() for t in (query, keys, values, tables, lengths)), 0.125).cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
