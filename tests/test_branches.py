"""Branches of one prompt over the engine's own KV pool (generation/branches.py, ``Engine.branches``): beam
search and n/best_of share the prompt's blocks by reference count, copy a shared block on first write, re-point
tables on reorder, reuse prefix-cached blocks, and give every block back, errors included.

Against the real embedded model (fp32, one torch thread)."""

from __future__ import annotations

import pytest
import torch

from generation.decoding.beam import BeamConfig, run_beam
from generation.decoding.best_of import run_best_of
from generation.engine import Engine
from generation.sample.sampler import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

BLOCK = 16
LOGIT_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def engine(loaded):
    return Engine(loaded, max_num_seqs=2, max_model_len=256)


def prompt_of(engine, length: int, salt: int = 0) -> list[int]:
    """A prompt of exactly ``length`` tokens (two full blocks and a partial one for 40), distinct per salt."""
    ids = engine.tokenizer("The quick brown fox jumps over the lazy dog while the cat sleeps in the sun. " * 8)["input_ids"]
    return [ids[0]] + [(t + salt) % engine.vocab_size for t in ids[1:length]]


def pool_state(engine):
    blocks = engine.scheduler.blocks
    return blocks.num_free, list(blocks.ref_counts)


def test_branches_share_the_prompt_blocks_copy_on_write_and_give_them_back(engine):
    blocks = engine.scheduler.blocks
    before = pool_state(engine)
    prompt = prompt_of(engine, 40, salt=1)  # blocks 0, 1 full; block 2 holds 8 of 16
    with engine.branches(prompt, 3, 8) as runner:
        runner.prefill()
        tables = runner.tables
        assert len(tables) == 3 and all(t == tables[0] for t in tables) and len(tables[0]) == 3
        assert [blocks.ref_counts[b] for b in tables[0]] == [3, 3, 3]  # one reference per branch
        assert blocks.num_free == before[0] - 3  # the prompt is stored once
        partial = tables[0][2]
        runner.step([11, 12, 13])
        tables = runner.tables
        assert all(t[:2] == tables[0][:2] for t in tables)  # full prompt blocks: still shared
        assert [blocks.ref_counts[b] for b in tables[0][:2]] == [3, 3]
        lasts = [t[2] for t in tables]
        assert len(set(lasts)) == 3 and partial in lasts  # copied on write, the last writer kept the original
        assert all(blocks.ref_counts[b] == 1 for b in lasts)
        runner.reorder([2, 2, 0])  # beam selection: re-pointed, no copy
        assert runner.tables[0] == runner.tables[1] == tables[2] and runner.tables[2] == tables[0]
        assert blocks.ref_counts[tables[2][2]] == 2 and blocks.ref_counts[tables[1][2]] == 0
        assert blocks.ref_counts[tables[0][0]] == 3
        runner.step([21, 22, 23])
        assert runner.tables[0][2] != runner.tables[1][2]  # the forked beams' shared block: copied on write
        runner.reorder([1])
        assert [blocks.ref_counts[b] for b in runner.tables[0]] == [1, 1, 1]
    assert runner.tables == []
    assert pool_state(engine) == before


def test_branch_logits_equal_a_plain_forward_through_reorders(engine):
    model = engine.loaded.model
    prompt = prompt_of(engine, 37, salt=2)
    branches = [[] for _ in range(3)]
    with engine.branches(prompt, 3, 8) as runner:
        runner.prefill()
        for tokens in ([11, 12, 13], [21, 22, 23], [31, 32, 33]):
            logits = runner.step(tokens)
            for branch, token in zip(branches, tokens):
                branch.append(token)
        runner.reorder([2, 2, 0])
        branches = [list(branches[2]), list(branches[2]), list(branches[0])]
        logits = runner.step([41, 42, 43])
        for branch, token in zip(branches, [41, 42, 43]):
            branch.append(token)
        runner.reorder([1, 0])
        branches = [branches[1], branches[0]]
        logits = runner.step([51, 52])
        for branch, token in zip(branches, [51, 52]):
            branch.append(token)
    with torch.inference_mode():
        reference = model(torch.tensor([prompt + b for b in branches])).logits[:, -1].float()
    assert logits.shape == reference.shape
    assert (logits - reference).abs().max().item() < LOGIT_TOLERANCE


def test_a_prefix_cached_prompt_is_not_recomputed(engine):
    prompt = prompt_of(engine, 40, salt=3)
    with engine.branches(prompt, 2, 4) as first:
        first.prefill()
        assert (first.cached_tokens, first.prefilled_tokens) == (0, 40)
        registered = first.tables[0][:2]
    with engine.branches(prompt, 2, 4) as again:  # the full blocks were registered, then released (evictable)
        again.prefill()
        assert (again.cached_tokens, again.prefilled_tokens) == (2 * BLOCK, 40 - 2 * BLOCK)
        assert again.tables[0][:2] == registered
    with engine.branches(prompt, 2, 4, cache_lookup=False) as seeded:  # a seeded request computes it all
        seeded.prefill()
        assert seeded.prefilled_tokens == 40


def test_the_step_lock_is_held_around_every_forward(engine, monkeypatch):
    seen = []
    for name in ("prefill", "decode"):
        original = getattr(engine.runner, name)

        def wrapped(*args, _original=original, **kwargs):
            seen.append(engine._step_lock.locked())
            return _original(*args, **kwargs)

        monkeypatch.setattr(engine.runner, name, wrapped)
    run_beam(engine, prompt_of(engine, 20, salt=4), SamplingParams(max_new_tokens=3, temperature=0.0), BeamConfig(2))
    assert seen and all(seen)
    assert not engine._step_lock.locked()


def test_an_error_mid_decode_gives_every_block_back(engine, monkeypatch):
    before = pool_state(engine)
    calls = []
    original = engine.runner.decode

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return original(*args, **kwargs)

    monkeypatch.setattr(engine.runner, "decode", failing)
    prompt = prompt_of(engine, 40, salt=5)
    with pytest.raises(RuntimeError, match="boom"):
        run_beam(engine, prompt, SamplingParams(max_new_tokens=8, temperature=0.0), BeamConfig(3))
    assert pool_state(engine)[0] == before[0] and not any(engine.scheduler.blocks.ref_counts)
    calls.clear()
    with pytest.raises(RuntimeError, match="boom"):
        run_best_of(engine, prompt, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3), 2, 3)
    assert pool_state(engine)[0] == before[0] and not any(engine.scheduler.blocks.ref_counts)


def test_running_out_of_blocks_raises_and_leaves_the_pool_whole(loaded):
    small = Engine(loaded, max_num_seqs=1, max_model_len=64, max_cache_tokens=64)  # 4 blocks
    prompt = prompt_of(small, 20, salt=6)  # 2 blocks; 4 branches then need 3 copies of the partial one
    with small.branches(prompt, 4, 40) as runner:
        runner.prefill()
        with pytest.raises(RuntimeError, match="KV blocks"):
            runner.step([1, 2, 3, 4])
    assert small.scheduler.blocks.num_free == 4 and not any(small.scheduler.blocks.ref_counts)
    with pytest.raises(ValueError, match="max_model_len"):
        small.branches(prompt, 2, 60)


def test_branches_refuse_misuse(engine):
    with engine.branches(prompt_of(engine, 10), 2, 2) as runner:
        with pytest.raises(RuntimeError, match="prefill"):
            runner.step([1, 2])
        runner.prefill()
        with pytest.raises(RuntimeError, match="prefill"):
            runner.prefill()
        with pytest.raises(ValueError, match="2 tokens"):
            runner.step([1])
        runner.step([1, 2])
        runner.step([1, 2])
        with pytest.raises(RuntimeError, match="all used"):
            runner.step([1, 2])
        with pytest.raises(ValueError, match="branch ids"):
            runner.reorder([0, 5])
    with pytest.raises(RuntimeError, match="closed"):
        runner.step([1, 2])
    for bad in ([], "x"):
        with pytest.raises((ValueError, TypeError)):
            engine.branches(bad, 2, 2)
    with pytest.raises(ValueError, match="n_branches"):
        engine.branches([1, 2], 0, 2)


def test_a_beam_search_between_engine_steps_leaves_other_requests_untouched(engine):
    params = SamplingParams(max_new_tokens=8, temperature=0.0, seed=1)  # seeded: computed afresh both times
    other = prompt_of(engine, 30, salt=7)
    (solo,) = engine.generate([other], params)
    rid = engine.submit(other, params)
    engine.step()  # its prefill
    engine.step()
    run_beam(engine, prompt_of(engine, 40, salt=8), params, BeamConfig(3))
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs[out.request_id] = out
    assert outputs[rid].token_ids == solo.token_ids
    assert engine.scheduler.blocks.num_used == 0
