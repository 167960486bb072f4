"""The paged KV cache: the block manager, the kernels reading keys through block tables, the scheduler's
block accounting and preemption, and the engine's memory per token."""

from __future__ import annotations

import os

import pytest
import torch

from generation.block_manager import BlockManager
from generation.cpu import native, paged_native
from generation.engine import Engine
from generation.kv_cache import CacheConfig, PagedKVCache, available_memory, default_cache_tokens, kv_bytes_per_token
from generation.sample.sampler import SamplingParams
from generation.scheduler import Scheduler, SchedulerConfig
from generation.sequence import Sequence, SequenceStatus, TextTracker

needs_kernels = pytest.mark.skipif(not native.available(torch.float32, torch.device("cpu")),
                                   reason="the native kernels do not build here")
DTYPES = [torch.float32, torch.bfloat16]


def make_seq(n: int, rid: str = "r") -> Sequence:
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    state = type("State", (), {"history": list(range(n))})()
    return Sequence(rid, list(range(n)), params, state, TextTracker(None, None))


def to_paged(slot: torch.Tensor, lengths: list[int], block_size: int, num_blocks: int, gen: torch.Generator):
    """The slot cache ``slot`` [B, KV, T, D] copied into a pool of blocks handed out in a shuffled order."""
    batch, heads, _, dim = slot.shape
    pool = torch.full((num_blocks, heads, block_size, dim), float("nan"), dtype=slot.dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = []
    for b, n in enumerate(lengths):
        table = [order.pop() for _ in range(-(-n // block_size))]
        for i, block in enumerate(table):
            part = slot[b, :, i * block_size:(i + 1) * block_size]
            pool[block, :, : part.shape[1]] = part
        tables.append(table)
    width = max(len(t) for t in tables)
    return pool, torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_attention_is_the_slot_kernel_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(0)
    lengths = [37, 1, 16, 90, 17]
    heads, kv_heads, dim, longest = 9, 3, 64, 96
    query = torch.randn(len(lengths), heads, 1, dim, generator=gen).to(dtype)
    keys = torch.randn(len(lengths), kv_heads, longest, dim, generator=gen).to(dtype)
    values = torch.randn(len(lengths), kv_heads, longest, dim, generator=gen).to(dtype)
    lens = torch.tensor(lengths)
    want = native.decode_attention(query, keys, values, lens)
    key_pool, tables = to_paged(keys, [longest] * len(lengths), 16, 64, torch.Generator().manual_seed(1))
    value_pool, _ = to_paged(values, [longest] * len(lengths), 16, 64, torch.Generator().manual_seed(1))
    got = paged_native.decode_attention(query, key_pool, value_pool, tables, lens)
    assert torch.equal(got, want)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_rope_step_writes_through_the_table_and_matches_the_slot_step(dtype):
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim = 4, 2, 64
    positions = torch.tensor([0, 15, 16, 40])
    batch = len(positions)
    qkv = torch.randn(batch, 1, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    cos = torch.randn(batch, 1, dim, generator=gen).to(dtype)
    sin = torch.randn(batch, 1, dim, generator=gen).to(dtype)
    slot_k = torch.randn(batch, kv_heads, 48, dim, generator=gen).to(dtype)
    slot_v = torch.randn(batch, kv_heads, 48, dim, generator=gen).to(dtype)
    pool_k, tables = to_paged(slot_k, [48] * batch, 16, 20, torch.Generator().manual_seed(3))
    pool_v, _ = to_paged(slot_v, [48] * batch, 16, 20, torch.Generator().manual_seed(3))
    want = native.rope_cache_attention(qkv, cos, sin, slot_k, slot_v, positions, heads, dim ** -0.5)
    got = paged_native.rope_cache_attention(qkv, cos, sin, pool_k, pool_v, tables, positions, heads, dim ** -0.5)
    assert torch.equal(got, want)
    for b, p in enumerate(positions.tolist()):  # the new key landed in the block the table names
        block, row = tables[b, p // 16], p % 16
        assert torch.equal(pool_k[block, :, row], slot_k[b, :, p]) and torch.equal(pool_v[block, :, row], slot_v[b, :, p])
    with pytest.raises(ValueError, match="outside"):
        paged_native.rope_cache_attention(qkv, cos, sin, pool_k, pool_v, tables, torch.tensor([0, 1, 2, 48]), heads,
                                          0.125)


def test_block_manager_hands_out_and_takes_back_blocks():
    blocks = BlockManager(num_blocks=5, block_size=4)
    a, b = make_seq(6, "a"), make_seq(9, "b")
    assert blocks.grow(a, 6) and a.block_table == [0, 1] and blocks.num_free == 3
    assert blocks.grow(b, 9) and len(b.block_table) == 3 and blocks.num_free == 0
    assert blocks.grow(a, 8) and len(a.block_table) == 2  # still fits its two blocks
    assert not blocks.grow(a, 9) and len(a.block_table) == 2  # nothing left: nothing taken
    assert blocks.ref_counts == [1] * 5
    blocks.release(b)
    assert blocks.num_free == 3 and b.block_table == [] and blocks.ref_counts == [1, 1, 0, 0, 0]
    assert blocks.grow(a, 9) and a.block_table[-1] == 2  # the most recently freed block first


def test_scheduler_preempts_the_newest_by_blocks_and_admits_by_blocks():
    config = SchedulerConfig(max_num_seqs=4, max_model_len=16, max_cache_tokens=24)
    scheduler = Scheduler(config, BlockManager(num_blocks=6, block_size=4))
    old, new = make_seq(7, "old"), make_seq(8, "new")
    scheduler.add(old)
    scheduler.add(new)
    batch = scheduler.schedule()
    assert [s.request_id for g in batch.prefill_groups for s in g] == ["new", "old"]  # longest first
    assert len(old.block_table) == 2 and len(new.block_table) == 2  # blocks for the prompt only
    for seq in (old, new):  # prefilled, first token sampled
        seq.num_cached = seq.num_tokens
        seq.output_ids.append(0)
    new.output_ids += [0] * 8  # new decoded on: 17 tokens need 5 blocks, old (8) holds 2: one short of 6
    new.num_cached = new.num_tokens - 1
    scheduler.schedule()
    assert new.status is SequenceStatus.WAITING and new.block_table == [] and scheduler.num_preemptions == 1
    assert scheduler.running == [old] and scheduler.blocks.num_free == 4


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux's /proc")
def test_the_pool_is_backed_by_memory_only_where_written(loaded):
    before = resident_bytes()
    cache = PagedKVCache(CacheConfig(8192, 2048), loaded.model.config, torch.device("cpu"), torch.float32)
    assert cache.nbytes == 8192 * 16 * kv_bytes_per_token(loaded.model.config, torch.float32)  # 6 GB reserved
    assert resident_bytes() - before < cache.nbytes // 20
    layer = cache.layers[0]
    assert float(layer.keys[:4].abs().sum()) == 0.0 and layer.keys.is_contiguous()  # zeros, the pools' layout
    del cache, layer


def test_default_pool_fits_64_sequences_and_follows_memory(loaded):
    model = loaded.model
    per_token = kv_bytes_per_token(model.config, torch.float32)
    # a quarter of what is available, between one full sequence and every sequence at full length
    assert default_cache_tokens(model, 64, 2048, available=8 * 2**30) == 8 * 2**30 // 4 // per_token >= 64 * 512
    assert default_cache_tokens(model, 64, 2048, available=64 * 2**30) == 64 * 2048
    assert default_cache_tokens(model, 64, 2048, available=2**20) == 2048
    assert default_cache_tokens(model, 2, 100) == 200  # never more than every sequence at full length
    assert available_memory() > 0  # the machine's reading (MemAvailable, which counts reclaimable page cache)
    layers, kv_heads, dim = 30, 3, 64  # SmolLM2-135M
    assert per_token == 2 * layers * kv_heads * dim * 4


def test_pool_memory_follows_the_tokens_in_use(loaded):
    prompt_ids = [loaded.vocab.tokenizer(f"Item {i}: " + "a fact about the sea and its tides. " * i)["input_ids"]
                  for i in range(1, 7)]
    engine = Engine(loaded, max_num_seqs=8, max_model_len=512, max_cache_tokens=4096)
    assert engine.runner.cache.config == CacheConfig(256, 512, 16)
    block_bytes = engine.runner.cache.block_nbytes
    assert block_bytes == 16 * kv_bytes_per_token(loaded.model.config, torch.float32)
    for ids in prompt_ids:
        engine.submit(ids, SamplingParams(max_new_tokens=6, temperature=0.0))
    engine.step()  # every prompt prefilled
    engine.step()  # one decode
    running = engine.scheduler.running
    in_use = sum(s.num_tokens for s in running)
    used = engine.scheduler.blocks.num_used
    assert used == sum(-(-s.num_tokens // 16) for s in running)  # blocks for the tokens, no more
    assert used * block_bytes < in_use * (block_bytes / 16) + len(running) * block_bytes  # < one block each
    while engine.has_unfinished():
        engine.step()
    assert engine.scheduler.blocks.num_free == 256 and set(engine.scheduler.blocks.ref_counts) == {0}
