"""Chunked prefill: a prompt arriving while others decode is computed a chunk per step beside their decodes,
every step still gives each running request its token, and the outputs stay transformers' own."""

from __future__ import annotations

import pytest
import torch

from generation.engine import Engine
from generation.sample.sampler import SamplingParams
from generation.scheduler import CHUNKED_PREFILL_ABOVE, chunk_budget

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

SHORT = ["The capital of France is", "Once upon a time, in a land far away, there lived a", "def fibonacci(n):"]
GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0)


def reference(loaded, ids: list[int], new: int) -> list[int]:
    with torch.inference_mode():
        x = torch.tensor([ids])
        y = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False)
    return y[0, len(ids):].tolist()


def logged(engine: Engine) -> list:
    """Record each step's batch: (prefill rows, decode rows, chunk sizes)."""
    log, schedule = [], engine.scheduler.schedule

    def wrapped():
        batch = schedule()
        log.append((sum(map(len, batch.prefill_groups)), len(batch.decode), [n for _, n in batch.chunks]))
        return batch

    engine.scheduler.schedule = wrapped
    return log


def run(engine: Engine, prompts, late, params, late_params, after: int = 3) -> dict:
    ids = [engine.submit(p, params) for p in prompts]
    done = {}
    for _ in range(after):
        done.update({o.request_id: o for o in engine.step() if o.finished})
    late_ids = [engine.submit(p, late_params) for p in late]
    while engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return {"early": [done[i].token_ids for i in ids], "late": [done[i].token_ids for i in late_ids]}


def test_a_long_prompt_arriving_into_decodes_is_prefilled_in_chunks_beside_them(loaded):
    engine = Engine(loaded, max_num_seqs=8, max_model_len=2048)
    tok = loaded.vocab.tokenizer
    prompts = [tok(p)["input_ids"] for p in SHORT]
    long = tok("Tell me everything about the tides of the northern sea. " * 100)["input_ids"]
    chunk = chunk_budget(len(prompts), engine.config.max_step_tokens)
    assert len(long) > CHUNKED_PREFILL_ABOVE
    log = logged(engine)
    forced = SamplingParams(max_new_tokens=100, min_new_tokens=100, temperature=0.0)  # decoding throughout
    outs = run(engine, prompts, [long], forced, GREEDY)
    chunked = [entry for entry in log if entry[2]]
    assert len(chunked) == -(-len(long) // chunk)  # a chunk a step, the whole prompt
    assert all(prefill == 0 and decode == 3 and sum(sizes) <= chunk
               for prefill, decode, sizes in chunked)  # every running request still got its token each step
    assert all(prefill == 0 for prefill, _, _ in log[1:])  # no prefill-only step stalled the decodes
    assert outs["late"][0] == reference(loaded, long, GREEDY.max_new_tokens)
    for got, prompt in zip(outs["early"], prompts):  # forced past EOS: transformers' tokens up to its EOS
        want = reference(loaded, prompt, 100)
        eos = loaded.vocab.eos_token_id
        want = want[:want.index(eos)] if eos in want else want
        assert got[:len(want)] == want


def test_a_short_prompt_arriving_into_decodes_is_chunked_too(loaded):
    """A prompt of a few dozen tokens never stalls the running requests for a prefill-only step either: it runs
    beside their decodes, a chunk a step, and its tokens stay transformers' own."""
    engine = Engine(loaded, max_num_seqs=8, max_model_len=2048)
    tok = loaded.vocab.tokenizer
    prompts = [tok(p)["input_ids"] for p in SHORT]
    short = tok("Name three rivers of Europe, say which sea each one reaches and which capital cities stand on "
                "its banks, and keep the answer brief.")["input_ids"]
    chunk = chunk_budget(len(prompts), engine.config.max_step_tokens)
    assert chunk < len(short) - 1 < 8 * chunk  # more than one chunk, fewer than the decodes' steps
    log = logged(engine)
    forced = SamplingParams(max_new_tokens=40, min_new_tokens=40, temperature=0.0)
    outs = run(engine, prompts, [short], forced, GREEDY)
    assert all(prefill == 0 for prefill, _, _ in log[1:])  # only the first prompts, with nothing decoding
    chunked = [sizes for _, _, sizes in log if sizes]
    assert all(sum(sizes) <= chunk for sizes in chunked)
    assert sum(sum(sizes) for sizes in chunked) in (len(short), len(short) - 1)  # the last may run as a decode row
    assert outs["late"][0] == reference(loaded, short, GREEDY.max_new_tokens)


def test_a_seeded_arrival_is_prefilled_whole_and_samples_as_alone(loaded):
    engine = Engine(loaded, max_num_seqs=8, max_model_len=2048)
    tok = loaded.vocab.tokenizer
    prompts = [tok(p)["input_ids"] for p in SHORT]
    long = tok("Tell me everything about the tides of the southern sea. " * 100)["input_ids"]
    assert len(long) > CHUNKED_PREFILL_ABOVE
    seeded = SamplingParams(max_new_tokens=12, temperature=0.9, seed=5)
    log = logged(engine)
    outs = run(engine, prompts, [long], SamplingParams(max_new_tokens=24, temperature=0.0), seeded)
    assert not any(sizes for _, _, sizes in log)  # never in chunks
    assert sum(1 for prefill, _, _ in log if prefill) == 2  # the first prompts, then the seeded one whole
    alone = Engine(loaded, max_num_seqs=8, max_model_len=2048).generate([long], seeded, use_tqdm=False)[0]
    assert outs["late"][0] == alone.token_ids


def test_arrivals_sharing_a_prompt_prefilled_in_chunks_wait_and_share_it(loaded):
    engine = Engine(loaded, max_num_seqs=8, max_model_len=2048)
    tok = loaded.vocab.tokenizer
    prompts = [tok(p)["input_ids"] for p in SHORT[:1]]
    system = tok("You answer questions about lighthouses, briefly and plainly. " * 90)["input_ids"]
    assert len(system) > CHUNKED_PREFILL_ABOVE
    late = [system + tok(f" Question {i}: who keeps the light?")["input_ids"] for i in range(4)]
    log = logged(engine)
    outs = run(engine, prompts, late, SamplingParams(max_new_tokens=200, min_new_tokens=200, temperature=0.0),
               GREEDY)
    assert any(sizes for _, _, sizes in log)  # the first was prefilled in chunks, the others waited for it
    blocks = engine.scheduler.blocks
    shared = len(system) // blocks.block_size
    assert blocks.hit_tokens >= 3 * shared * blocks.block_size  # the system prompt computed once, found 3 times
    assert outs["late"] == [reference(loaded, p, GREEDY.max_new_tokens) for p in late]
