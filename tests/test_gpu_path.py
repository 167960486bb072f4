"""The CUDA decode path, tested on the CPU: the block-table attention (generation/gpu/paged_attention.py)
against a naive reference and the native kernels, and the static buckets of the CUDA graphs
(generation/gpu/graphs.py) run eagerly against the runner's dynamic decode. The same checks on a GPU are in
tests/test_gpu_cuda.py (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from generation.cpu import native, paged_native
from generation.engine import Engine
from generation.gpu.graphs import BATCH_BUCKETS, DecodeGraphs, bucket_for, padded_inputs, width_buckets
from generation.gpu.paged_attention import block_table_attention, gather_blocks
from generation.kv_cache import CacheConfig
from generation.models import load_model
from generation.runner import ComputePaths, ModelRunner
from generation.sample.sampler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCK = 16


def reference_attention(query, keys, values, tables, lengths, scale):
    """Row by row, head by head: softmax(q k^T * scale) v over the row's keys read position by position."""
    batch, heads, _, dim = query.shape
    group = heads // keys.shape[1]
    out = torch.empty(batch, 1, heads, dim, dtype=torch.float64)
    for b in range(batch):
        n = int(lengths[b])
        blocks = [int(tables[b, p // BLOCK]) for p in range(n)]
        for h in range(heads):
            k = torch.stack([keys[blk, h // group, p % BLOCK] for p, blk in enumerate(blocks)]).double()
            v = torch.stack([values[blk, h // group, p % BLOCK] for p, blk in enumerate(blocks)]).double()
            weights = torch.softmax(k @ query[b, h, 0].double() * scale, dim=0)
            out[b, 0, h] = weights @ v
    return out


def random_case(gen, lengths, width, kv_heads=3, heads=9, dim=64, num_blocks=40, shared_first=False):
    keys = torch.randn(num_blocks, kv_heads, BLOCK, dim, generator=gen)
    values = torch.randn(num_blocks, kv_heads, BLOCK, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # shuffled tables: blocks out of order
    tables = torch.tensor([order[i * width:(i + 1) * width] for i in range(len(lengths))])
    if shared_first:  # every row's first block is row 0's (a shared prefix)
        tables[:, 0] = tables[0, 0]
    query = torch.randn(len(lengths), heads, 1, dim, generator=gen)
    return query, keys, values, tables, torch.tensor(lengths)


def test_gather_blocks_reads_each_row_through_its_table():
    gen = torch.Generator().manual_seed(0)
    pool = torch.randn(10, 2, BLOCK, 4, generator=gen)
    tables = torch.tensor([[7, 2, 9], [0, 7, 3]])
    got = gather_blocks(pool, tables)
    assert got.shape == (2, 2, 3 * BLOCK, 4)
    for b in range(2):
        for p in range(3 * BLOCK):
            assert torch.equal(got[b, :, p], pool[tables[b, p // BLOCK], :, p % BLOCK])


@pytest.mark.parametrize("shared", [False, True])
def test_block_table_attention_matches_a_naive_reference(shared):
    gen = torch.Generator().manual_seed(1)
    lengths = [1, 17, 48, 5, 33]  # one key, block edges, a full table, partial blocks
    query, keys, values, tables, lengths_t = random_case(gen, lengths, width=3, shared_first=shared)
    got = block_table_attention(query, keys, values, tables, lengths_t, scale=0.125)
    assert got.shape == (5, 1, 9, 64)
    want = reference_attention(query, keys, values, tables, lengths_t, 0.125)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_block_table_attention_ignores_everything_past_a_rows_length():
    gen = torch.Generator().manual_seed(2)
    query, keys, values, tables, lengths = random_case(gen, [20, 3], width=2)
    before = block_table_attention(query, keys, values, tables, lengths)
    for b, n in enumerate(lengths.tolist()):  # garbage in the rest of each row's blocks
        for p in range(n, 2 * BLOCK):
            keys[tables[b, p // BLOCK], :, p % BLOCK] = 1e4
    torch.testing.assert_close(block_table_attention(query, keys, values, tables, lengths), before)


def test_block_table_attention_rejects_shapes_that_do_not_fit():
    gen = torch.Generator().manual_seed(3)
    query, keys, values, tables, lengths = random_case(gen, [4, 4], width=1)
    with pytest.raises(ValueError, match="do not fit"):
        block_table_attention(query[:, :, :1].expand(2, 9, 2, 64), keys, values, tables, lengths)
    with pytest.raises(ValueError, match="do not fit"):
        block_table_attention(query, keys, values, tables[:1], lengths)


@pytest.mark.skipif(not native.available(torch.float32, torch.device("cpu")), reason="native kernels not built")
def test_block_table_attention_matches_the_native_kernel():
    gen = torch.Generator().manual_seed(4)
    query, keys, values, tables, lengths = random_case(gen, [9, 40, 16, 1], width=3)
    got = block_table_attention(query, keys, values, tables, lengths, scale=0.125)
    want = paged_native.decode_attention(query, keys, values, tables, lengths, 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_buckets_and_padding():
    assert [bucket_for(n, BATCH_BUCKETS) for n in (1, 3, 16, 17, 64, 65)] == [1, 4, 16, 32, 64, None]
    assert width_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert width_buckets(20) == (1, 2, 4, 8, 16, 20)
    assert width_buckets(1) == (1,)
    positions, tables = padded_inputs([5, 40], [[3], [7, 1, 4]], rows=4, width=4, scratch=99)
    assert positions == [5, 40, 0, 0]
    assert tables == [[3, 99, 99, 99], [7, 1, 4, 99], [99] * 4, [99] * 4]
    with pytest.raises(ValueError):
        padded_inputs([1, 2, 3], [[1], [2], [3]], rows=2, width=1, scratch=0)


@pytest.fixture(scope="module")
def cpu_loaded(loaded):
    """The default model on the CPU in float32 (the session's own where it is that: on a GPU machine it is not)."""
    if loaded.device.type == "cpu" and loaded.dtype == torch.float32:
        return loaded
    return load_model(device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def runners(cpu_loaded):
    """A dynamic block-table runner and one through the static buckets (run eagerly here), plain weights."""
    config = CacheConfig(num_blocks=48, max_model_len=256)
    dynamic = ModelRunner(cpu_loaded.model, config, packed_weights=False, native_kernels=False,
                          block_table_attention=True, cuda_graphs=False)
    static = ModelRunner(cpu_loaded.model, config, packed_weights=False, native_kernels=False,
                         block_table_attention=True, cuda_graphs=True)
    return dynamic, static


def test_the_loaded_model_keeps_its_attention(cpu_loaded, runners):
    dynamic, static = runners
    assert dynamic.block_table_attention and static.graphs is not None and dynamic.graphs is None
    assert cpu_loaded.model.config._attn_implementation == "sdpa"
    assert static.cache.config.num_blocks == 49 and static.graphs.scratch == 48  # the scratch block is extra
    with pytest.raises(ValueError, match="CUDA"):
        DecodeGraphs(dynamic, 0, capture=True)


def test_static_buckets_give_the_dynamic_decodes_logits(cpu_loaded, runners):
    """Ragged rows on shuffled, partly shared tables: prefill, then decode steps through both runners."""
    dynamic, static = runners
    gen = torch.Generator().manual_seed(5)
    lengths = [3, 40, 17]
    prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in lengths]
    tables = [[30, 4, 11], [7, 22, 2, 41], [5, 19, 9]]
    for runner in runners:
        runner.prefill(prompts, [0, 0, 0], tables)
    positions = list(lengths)
    for step in range(3):
        tokens = torch.randint(100, 40000, (3,), generator=gen)
        want = dynamic.decode(tokens, positions, tables)
        got = static.decode(tokens, positions, tables)
        assert got.shape == want.shape == (3, cpu_loaded.model.config.vocab_size)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        # a prompt chunk's rows (sharing a sequence) and only some rows' logits
        chunk = (tokens[:2], [positions[0] + 1, positions[0] + 2], tables[:1] * 2, [1])
        picked = static.decode(*chunk)
        assert picked.shape == (1, want.shape[1])
        torch.testing.assert_close(picked, dynamic.decode(*chunk), atol=1e-4, rtol=1e-4)
        positions = [p + 1 for p in positions]
    assert static.graphs.replays == 6 and set(static.graphs.batches) == {(4, 4), (2, 1)}


def test_the_engine_through_static_buckets_matches_the_native_default(cpu_loaded):
    prompts = [cpu_loaded.vocab.tokenizer(p)["input_ids"] for p in ("The capital of France is", "def fibonacci(n):")]
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    default = Engine(cpu_loaded, max_num_seqs=4, max_model_len=128)
    cuda_like = Engine(cpu_loaded, max_num_seqs=4, max_model_len=128,
                       paths=ComputePaths(packed_weights=False, native_kernels=False, block_table_attention=True,
                                          cuda_graphs=True))
    want = [o.token_ids for o in default.generate(prompts, greedy, use_tqdm=False)]
    got = [o.token_ids for o in cuda_like.generate(prompts, greedy, use_tqdm=False)]
    assert got == want
    assert cuda_like.runner.graphs.replays > 0


def test_native_kernels_and_block_table_attention_exclude_each_other(cpu_loaded):
    with pytest.raises(ValueError, match="choose one"):
        ModelRunner(cpu_loaded.model, CacheConfig(8, 64), native_kernels=True, block_table_attention=True)
    with pytest.raises(ValueError, match="block-table"):
        ModelRunner(cpu_loaded.model, CacheConfig(8, 64), block_table_attention=False, cuda_graphs=True)


def test_block_table_runner_equals_the_plain_gather_path(cpu_loaded, runners):
    """Against the runner without it (keys gathered per row, transformers' SDPA with a mask): equal-length
    prompts (prefilled with is_causal, no mask) and ragged ones, then a ragged decode step."""
    dynamic, _ = runners
    plain = ModelRunner(cpu_loaded.model, CacheConfig(num_blocks=48, max_model_len=256), packed_weights=False,
                        native_kernels=False, block_table_attention=False, cuda_graphs=False)
    gen = torch.Generator().manual_seed(6)
    tables = [[12, 3], [40, 8], [1, 44]]
    for lengths in ([20, 20, 20], [20, 7, 31]):
        prompts = [torch.randint(100, 40000, (n,), generator=gen).tolist() for n in lengths]
        want = plain.prefill(prompts, [0, 0, 0], tables)
        torch.testing.assert_close(dynamic.prefill(prompts, [0, 0, 0], tables), want, atol=1e-4, rtol=1e-4)
    tokens = torch.tensor([200, 300, 400])
    want = plain.decode(tokens, [20, 7, 31], tables)
    torch.testing.assert_close(dynamic.decode(tokens, [20, 7, 31], tables), want, atol=1e-4, rtol=1e-4)
