"""generation.engine against the real embedded model: exactness vs transformers, batching, stops, streaming."""

from __future__ import annotations

import threading

import pytest
import torch

from generation.engine import Engine
from generation.sample.sampler import SamplingParams
from generation.scheduler import SchedulerConfig

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived a",
    "def fibonacci(n):",
    "Write a haiku about the sea.\n",
    "List three prime numbers and explain, step by step, why each of them is prime. Be brief but precise:",
    "Q: What is 17 times 3?\nA:",
]
NON_ASCII_CHAT = [{"role": "user", "content": "Translate to Chinese: I love the sea."}]
GREEDY = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)


@pytest.fixture(scope="module")
def engine(loaded):
    return Engine(loaded, max_num_seqs=8, max_model_len=256)


@pytest.fixture(scope="module")
def prompt_ids(loaded):
    return [loaded.vocab.tokenizer(p)["input_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def reference(loaded, prompt_ids):
    """transformers' own greedy generate, one prompt at a time (it stops after EOS, keeping it)."""
    outs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=NEW_TOKENS, do_sample=False)
            outs.append(y[0, len(ids):].tolist())
    return outs


def test_greedy_alone_matches_transformers(engine, prompt_ids, reference):
    for ids, ref in zip(prompt_ids, reference):
        (out,) = engine.generate([ids], GREEDY)
        assert out.token_ids == ref
        assert out.finish_reason == ("stop" if len(ref) < NEW_TOKENS else "length")
        assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(ref)


def test_greedy_mixed_batch_matches_transformers(engine, prompt_ids, reference):
    outs = engine.generate(prompt_ids, GREEDY)
    assert [o.token_ids for o in outs] == reference


def test_requests_joining_mid_way_match_transformers(engine, prompt_ids, reference):
    first = [engine.submit(ids, GREEDY) for ids in prompt_ids[:3]]
    finished = {}
    for _ in range(5):
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    later = [engine.submit(ids, GREEDY) for ids in prompt_ids[3:]]
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert [finished[r].token_ids for r in first + later] == reference


def test_tiny_cache_waits_and_preempts_yet_matches(loaded, prompt_ids, reference):
    longest = max(len(i) for i in prompt_ids) + NEW_TOKENS
    engine = Engine(loaded, max_num_seqs=3, max_model_len=longest + 1, max_cache_tokens=longest + 32)
    outs = engine.generate(prompt_ids, GREEDY)
    assert engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in outs] == reference


def test_cache_budget_below_one_sequence_is_rejected():
    with pytest.raises(ValueError, match="max_cache_tokens"):
        SchedulerConfig(max_num_seqs=2, max_model_len=64, max_cache_tokens=32)


def test_stop_string_truncates_and_never_streams(engine, prompt_ids, reference, loaded):
    full = engine.generate([prompt_ids[1]], GREEDY)[0].text
    stop = full[20:26]  # a string the greedy continuation is known to contain
    assert stop and full.find(stop) == 20
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, stop=[stop, "zzzz-never"])
    deltas = list(engine.stream(prompt_ids[1], params))
    out = engine.generate([prompt_ids[1]], params)[0]
    assert out.finish_reason == "stop" and out.text == full[:20]
    assert "".join(deltas) == out.text and stop not in "".join(deltas)


def test_stop_token_id_and_max_tokens(engine, prompt_ids, reference):
    ref = reference[1]
    k = 5
    stop_id = ref[k]
    first = ref.index(stop_id)
    out = engine.generate([prompt_ids[1]], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop" and out.token_ids == ref[: first + 1]
    out = engine.generate([prompt_ids[1]], SamplingParams(max_new_tokens=7, temperature=0.0))[0]
    assert out.finish_reason == "length" and out.token_ids == ref[:7]


def test_ignore_eos_runs_to_max_tokens(engine, prompt_ids, reference):
    stops_early = next(i for i, r in enumerate(reference) if len(r) < NEW_TOKENS)
    out = engine.generate([prompt_ids[stops_early]], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == NEW_TOKENS
    assert out.token_ids[: len(reference[stops_early])] == reference[stops_early]


def test_stream_is_utf8_safe_and_concatenates_to_text(engine, loaded):
    ids = engine.apply_chat_template(NON_ASCII_CHAT)
    params = SamplingParams(max_new_tokens=40, temperature=0.0)
    deltas = list(engine.stream(ids, params))
    out = engine.generate([ids], params)[0]
    tokenizer = loaded.vocab.tokenizer
    split_chars = sum("\ufffd" in tokenizer.decode([t]) for t in out.token_ids)
    assert split_chars > 0, "prompt no longer produces multi-byte characters split across tokens"
    assert not out.text.isascii()
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == out.text


def test_seeded_sampling_same_alone_and_in_batch(engine, prompt_ids):
    params = SamplingParams(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    alone = engine.generate([prompt_ids[0]], params)[0].token_ids
    others = [SamplingParams(max_new_tokens=24, temperature=1.0, seed=s) for s in range(len(prompt_ids) - 1)]
    batch = engine.generate([prompt_ids[0], *prompt_ids[1:]], [params, *others])
    assert batch[0].token_ids == alone


def test_logprobs_match_greedy_choice(engine, prompt_ids):
    out = engine.generate([prompt_ids[0]], SamplingParams(max_new_tokens=5, temperature=0.0, logprobs=3))[0]
    assert len(out.logprobs) == len(out.top_logprobs) == len(out.token_ids)
    for token, lp, top in zip(out.token_ids, out.logprobs, out.top_logprobs):
        assert top[0][0] == token and abs(top[0][1] - lp) < 1e-5 and lp <= 0


def test_hard_watermark_makes_every_scored_token_green(engine, loaded, prompt_ids):
    from watermark.config import WatermarkSpec
    from watermark.scheme import Watermark

    spec = WatermarkSpec.parse("kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0,prf=hmac-sha256,hard")
    wm = Watermark(spec, b"k" * 32, loaded.vocab.vocab_size, key_id="test-key")
    out = engine.generate([prompt_ids[2]], SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True), [wm])[0]
    flags = wm.green_flags(prompt_ids[2] + out.token_ids)[-len(out.token_ids):]
    assert bool(flags.all())
    assert out.watermark.spec == spec.format() and out.watermark.key_id == "test-key"
    assert out.watermark.fingerprint == wm.fingerprint


def test_abort_and_closing_a_stream(engine, prompt_ids):
    rid = engine.submit(prompt_ids[0], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.abort(rid)
    outs = [o for o in engine.step() if o.request_id == rid]
    assert outs and outs[0].finished and outs[0].finish_reason == "abort"
    stream = engine.stream(prompt_ids[1], SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    next(stream)
    stream.close()
    while engine.has_unfinished():
        engine.step()
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_submit_from_threads_while_stepping(engine, prompt_ids, reference):
    ids: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: ids.__setitem__(i, engine.submit(prompt_ids[i], GREEDY)))
               for i in range(len(prompt_ids))]
    for t in threads:
        t.start()
    done = {}
    while any(t.is_alive() for t in threads) or engine.has_unfinished():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    for t in threads:
        t.join()
    assert [done[ids[i]].token_ids for i in range(len(prompt_ids))] == reference


@pytest.mark.parametrize("bad, match", [
    ("", "empty"),
    ([10**6], "outside"),
    ("word " * 300, "max_model_len"),
])
def test_bad_prompts_are_rejected(engine, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.submit(bad, GREEDY)


def test_duplicate_request_id_is_rejected(engine, prompt_ids):
    engine.submit(prompt_ids[0], GREEDY, request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        engine.submit(prompt_ids[0], GREEDY, request_id="dup")
    engine.abort("dup")
    while engine.has_unfinished():
        engine.step()
