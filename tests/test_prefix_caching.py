"""Automatic prefix caching: hashed full blocks shared between prompts, reference counts, LRU eviction,
greedy exactness with hits, simultaneous arrivals sharing one system prompt, seeded requests untouched."""

from __future__ import annotations

import pytest
import torch

from generation.block_manager import BlockManager, chain_hash
from generation.engine import Engine
from generation.sample.sampler import SamplingParams
from generation.sequence import Sequence, TextTracker

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)
SYSTEM = ("You are a careful assistant for a maritime museum. Answer in one short sentence, name the ship or "
          "the person when you know it, and say so plainly when you do not know. ") * 2
QUESTIONS = ["Who built the Cutty Sark?", "What is a sextant for?", "Why are ships painted red below the waterline?",
             "What does a lighthouse keeper do?"]


def make_seq(ids: list[int], rid: str = "r", seed: int | None = None) -> Sequence:
    params = SamplingParams(max_new_tokens=4, temperature=0.0 if seed is None else 1.0, seed=seed)
    state = type("State", (), {"history": list(ids)})()
    return Sequence(rid, list(ids), params, state, TextTracker(None, None))


def chat(engine: Engine, question: str) -> list[int]:
    return engine.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def reference(loaded, ids: list[int], new: int) -> list[int]:
    with torch.inference_mode():
        x = torch.tensor([ids])
        y = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False)
    return y[0, len(ids):].tolist()


def test_hash_chain_depends_on_the_whole_prefix():
    a = chain_hash(chain_hash(b"", [1, 2]), [3, 4])
    assert a == chain_hash(chain_hash(b"", [1, 2]), [3, 4])
    assert a != chain_hash(chain_hash(b"", [9, 2]), [3, 4])  # same block, another prefix: another hash
    assert len(a) == 32


def test_lookup_shares_full_blocks_counts_refs_and_evicts_least_recently_released():
    blocks = BlockManager(num_blocks=6, block_size=4, prefix_caching=True)
    first = make_seq(list(range(10)), "first")  # blocks [0..3] [4..7] and two tokens
    assert blocks.lookup(first) == []
    blocks.admit(first, [])
    first.num_cached = 10
    blocks.register(first)
    second = make_seq(list(range(9)) + [99], "second")
    found = blocks.lookup(second)
    assert found == first.block_table[:2]  # both full blocks, the partial third is not shared
    blocks.admit(second, found)
    assert second.num_cached == 8 and blocks.hit_tokens == 8 and blocks.prompt_tokens == 20
    assert [blocks.ref_counts[b] for b in found] == [2, 2] and blocks.num_used == 4  # 3 + 1 new
    exact = make_seq(list(range(8)), "exact")  # a prompt of exactly two blocks: its last token is computed
    assert blocks.lookup(exact) == found[:1]
    blocks.release(first)
    blocks.release(second)
    assert blocks.num_free == 6 and set(blocks.ref_counts) == {0}
    assert len(blocks.evictable) == 2 and len(blocks.cached) == 2  # kept, findable
    # released last-block-first: the second block went idle before the first, so it is reused first
    hog = make_seq(list(range(100, 120)), "hog")  # 5 blocks: the 4 never-hashed free ones, then one cached
    blocks.admit(hog, [])
    assert list(blocks.evictable) == [found[0]] and list(blocks.cached.values()) == [found[0]]
    assert blocks.lookup(make_seq(list(range(10)))) == found[:1]  # the first block is still findable
    blocks.release(hog)
    assert blocks.lookup(make_seq(list(range(10)))) == found[:1]


def test_seeded_requests_never_look_up():
    blocks = BlockManager(num_blocks=6, block_size=4, prefix_caching=True)
    first = make_seq(list(range(10)))
    blocks.admit(first, [])
    first.num_cached = 10
    blocks.register(first)
    assert blocks.lookup(make_seq(list(range(10)), seed=3)) == []


def test_cached_prompts_match_transformers_and_only_compute_their_tail(loaded):
    engine = Engine(loaded, max_num_seqs=4, max_model_len=512)
    prompts = [chat(engine, q) for q in QUESTIONS]
    shared = min(len(p) for p in prompts)
    assert shared > 64
    first = engine.generate(prompts[:1], GREEDY, use_tqdm=False)[0]
    blocks = engine.scheduler.blocks
    assert blocks.hit_tokens == 0 and len(blocks.cached) >= (len(prompts[0]) - 1) // 16
    rest = engine.generate(prompts[1:], GREEDY, use_tqdm=False)
    common = next(i for i, t in enumerate(zip(*prompts)) if len(set(t)) > 1)  # the system prompt's tokens
    assert blocks.hit_tokens >= 3 * (common // 16) * 16 > 0
    for ids, out in zip(prompts, [first, *rest]):
        assert out.token_ids == reference(loaded, ids, GREEDY.max_new_tokens)
    again = engine.generate(prompts[:1], GREEDY, use_tqdm=False)[0]  # the whole prompt cached but its last token
    assert again.token_ids == first.token_ids


def test_simultaneous_arrivals_share_one_copy_of_the_system_prompt(loaded):
    engine = Engine(loaded, max_num_seqs=8, max_model_len=512)
    prompts = [chat(engine, f"{q} (visitor {i})") for i in range(2) for q in QUESTIONS]
    common = next(i for i, t in enumerate(zip(*prompts)) if len(set(t)) > 1)
    full = common // 16
    ids = [engine.submit(p, GREEDY) for p in prompts]
    steps = []
    while engine.has_unfinished():
        outs = engine.step()
        steps.append(len(outs))
        if len(engine.scheduler.running) == len(prompts) and not any(o.finished for o in outs):
            shared = engine.scheduler.running[0].block_table[:full]
            assert all(s.block_table[:full] == shared for s in engine.scheduler.running)  # one copy, 8 holders
            assert all(engine.scheduler.blocks.ref_counts[b] == len(prompts) for b in shared)
    blocks = engine.scheduler.blocks
    assert blocks.hit_tokens >= (len(prompts) - 1) * full * 16  # all but the first found the system prompt
    assert steps[0] == 1  # the first prompt alone computes the shared blocks, the others follow as hits
    assert set(blocks.ref_counts) == {0}
    assert len(ids) == len(prompts)


def test_prefix_caching_off_computes_everything(loaded):
    engine = Engine(loaded, max_num_seqs=4, max_model_len=512, prefix_caching=False)
    prompts = [chat(engine, q) for q in QUESTIONS[:2]]
    outs = engine.generate(prompts, GREEDY, use_tqdm=False)
    assert engine.scheduler.blocks.hit_tokens == 0 and engine.scheduler.blocks.cached == {}
    assert [o.token_ids for o in outs] == [reference(loaded, p, GREEDY.max_new_tokens) for p in prompts]


def test_a_seeded_request_samples_the_same_with_its_prompt_cached_or_not(loaded):
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seed=11)
    warm = Engine(loaded, max_num_seqs=4, max_model_len=512)
    prompt = chat(warm, QUESTIONS[0])
    warm.generate([prompt], GREEDY, use_tqdm=False)  # the prompt's blocks are now cached
    hits = warm.scheduler.blocks.hit_tokens
    got = warm.generate([prompt], params, use_tqdm=False)[0]
    assert warm.scheduler.blocks.hit_tokens == hits  # the seeded request did not look the cache up
    cold = Engine(loaded, max_num_seqs=4, max_model_len=512)
    assert got.token_ids == cold.generate([prompt], params, use_tqdm=False)[0].token_ids
