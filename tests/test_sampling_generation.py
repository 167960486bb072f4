"""Generating with the sampling watermarks (generation/sample/sampling_stage.py): the pruned Gumbel race
equals the full race, the pipeline stage serves its rows only, greedy and vllm:gumbel fail closed, context
dedup and transformers' SynthID window, the decoding methods' policy, and speculative decoding
token-identical to the engine (a tiny random Llama; the embedded model is in test_sampling_generation_model.py)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from test_speculative import TINY_PROMPTS, TINY_VOCAB, _tiny_llama, make_tiny_engine

from generation.decoding import DecodingParams
from generation.decoding.beam import BeamConfig
from generation.decoding.mbr import MBRConfig
from generation.decoding.speculative.decode import speculative_decode
from generation.decoding.speculative.drafters import ModelDrafter, PromptLookupDrafter
from generation.sample.context_memory import GeneratedContexts
from generation.sample.params import SamplerState, SamplingParams
from generation.sample.pipeline import LogitsPipeline, StepRows
from generation.sample.sampling_stage import SAMPLING_STAGE, row_context
from generation.sample.watermark_stage import KGW_BIAS, stage_for
from watermark import gumbel as gumbel_module
from watermark.gumbel import race_scores
from watermark.hf_synthid import HFContextWindow, HFSynthIDState, context_hash_value
from watermark.sampling_common import SamplingWatermarkError
from watermark.scheme import make_watermark

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

SECRET = hashlib.sha256(b"provmark-test/sampling-generation").digest()
V = 49152
HF_SPEC = "hf:synthid,keys=654:400:836:123:340:443:597:160:57:590,ngram_len=3,context_history_size=16"


@pytest.fixture(scope="module")
def tiny_engine():
    return make_tiny_engine()


def _native_survivors():
    from generation.cpu import native

    return native.gumbel_survivors if native._library() is not None else None


# ------------------------------------------------------------------ the pruned race is the full race

@pytest.mark.parametrize("backend", ["tensor", "native"])
@pytest.mark.parametrize("scale", [8.0, 3.0, 0.3, 0.01])
def test_pruned_gumbel_choice_is_the_full_race(backend, scale, monkeypatch):
    """argmax_v log p_v + G_v over the whole vocabulary, from sharp (few survivors) to nearly flat (many)."""
    chosen_backend = None if backend == "tensor" else _native_survivors()
    if backend == "native" and chosen_backend is None:
        pytest.skip("native kernels not built here")
    monkeypatch.setattr(gumbel_module, "_survivors_backend", chosen_backend)
    mark = make_watermark("gumbel:h=3", SECRET, V, "k")
    gen = torch.Generator().manual_seed(int(scale * 100))
    logits = torch.randn(12, V, generator=gen) * scale
    logits[:4, ::3] = float("-inf")  # truncated tokens
    logits[4, 100:] = float("-inf")  # a top-k-like row: 100 live tokens
    probs = logits.softmax(-1)
    contexts = torch.randint(0, V, (12, 3), generator=gen)
    full = torch.argmax(race_scores(probs, mark.one_minus_r(contexts)), dim=-1)
    assert torch.equal(mark.choose_from_probs(probs, contexts), full)
    assert bool((probs.gather(1, full[:, None]) > 0).all())  # never a truncated token


# ------------------------------------------------------------------ the stage in the pipeline

def _states(n: int, prompt=(5, 6, 7, 8), **params) -> list[SamplerState]:
    return [SamplerState(SamplingParams(seed=100 + i, **params), list(prompt) + [i], {0}) for i in range(n)]


def test_stage_dispatch_by_spec():
    assert stage_for(make_watermark("gumbel:h=4", SECRET, V, "k")) is SAMPLING_STAGE
    assert stage_for(make_watermark("synthid:h=4", SECRET, V, "k")) is SAMPLING_STAGE
    assert stage_for(make_watermark(HF_SPEC, None, V)) is SAMPLING_STAGE
    assert stage_for(make_watermark(None, SECRET, V, "k")) is KGW_BIAS


def test_gumbel_rows_take_the_keyed_race_and_no_randomness():
    """The token is the race over the row's distribution after temperature and top-p, whatever the seed;
    an unwatermarked row in the same batch draws as it would alone."""
    mark = make_watermark("gumbel:h=4,dedup=false", SECRET, V, "k")
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(3)) * 3
    pipe = LogitsPipeline(V, "cpu")
    outs = []
    for seed_shift in (0, 1000):
        states = [SamplerState(SamplingParams(seed=s + seed_shift, temperature=0.7, top_p=0.9), [5, 6, 7, 8, s], {0})
                  for s in range(4)]
        outs.append(pipe.sample(logits, StepRows.of(states, [mark, mark, mark, None])).token_ids)
    assert torch.equal(outs[0][:3], outs[1][:3])  # no generator involved
    probs = pipe.probabilities(logits[:3].clone(), StepRows.of(_states(3, temperature=0.7, top_p=0.9)))
    contexts = torch.tensor([[6, 7, 8, s] for s in range(3)])
    assert torch.equal(outs[0][:3], mark.choose_from_probs(probs, contexts))
    alone = pipe.sample(logits[3:], StepRows.of([SamplerState(SamplingParams(seed=3, temperature=0.7, top_p=0.9),
                                                               [5, 6, 7, 8, 3], {0})])).token_ids
    assert outs[0][3] == alone[0]


@pytest.mark.parametrize("spec", ["gumbel:h=4", "synthid:h=4", "synthid:h=4,top_k=0", HF_SPEC])
def test_top_k_rows_choose_from_their_head_as_from_the_whole_row(spec, monkeypatch):
    """A top-k row's stage gets its head (sampling.head_distributions) and chooses the token the
    whole-vocabulary path chooses, with the same draws: what speculative replay relies on."""
    from generation.sample import sampler

    keyed = not spec.startswith("hf:")
    mark = make_watermark(spec, SECRET if keyed else None, V, "k" if keyed else None)
    logits = torch.randn(6, V, generator=torch.Generator().manual_seed(8)) * 2
    chosen = {}
    for head in (True, False):
        monkeypatch.setattr(sampler, "TOP_K_HEAD", head)
        states = _states(6, temperature=0.9, top_k=50, top_p=0.95)
        chosen[head] = LogitsPipeline(V, "cpu").sample(logits, StepRows.of(states, [mark] * 6)).token_ids
    assert torch.equal(chosen[True], chosen[False])


@pytest.mark.parametrize("spec", ["gumbel:h=4", "synthid:h=4", HF_SPEC])
def test_greedy_fails_closed(spec):
    mark = make_watermark(spec, None if spec.startswith("hf") else SECRET, V, None if spec.startswith("hf") else "k")
    with pytest.raises(SamplingWatermarkError, match="greedy"):
        StepRows.of(_states(1, temperature=0.0), [mark])


def test_vllm_gumbel_is_refused_for_generation():
    mark = make_watermark("vllm:gumbel,context_width=4", SECRET, V, "k")
    with pytest.raises(SamplingWatermarkError, match="does not generate"):
        StepRows.of(_states(1), [mark])


# ------------------------------------------------------------------ per-sequence memory

def test_dedup_leaves_a_repeated_generated_context_to_the_plain_draw():
    mark = make_watermark("gumbel:h=2", SECRET, V, "k")
    state = SamplerState(SamplingParams(seed=1), [9, 1, 2], {0})  # the prompt ends in context (1, 2)
    assert row_context(mark, state, state.history) == ([1, 2], True)  # seen in the prompt only: watermarked
    for token in (1, 2, 3):
        state.append(token)  # generated contexts so far: (1, 2) at the first token, (2, 1), (1, 2) again
    assert row_context(mark, state, state.history) == ([2, 3], True)
    state.append(1)
    state.append(2)
    assert row_context(mark, state, state.history) == ([1, 2], False)  # (1, 2) was a generated position's context
    assert row_context(mark, state, state.history + [7, 1, 2])[1] is False  # drafted: checked ...
    assert row_context(mark, state, state.history + [7])[1] is True  # ... not remembered
    plain = make_watermark("gumbel:h=2,dedup=false", SECRET, V, "k")
    fresh = SamplerState(SamplingParams(seed=1), list(state.history), {0})
    assert row_context(plain, fresh, fresh.history)[1] is True


def test_generated_contexts_remember_drafts_only_once_committed():
    memory = GeneratedContexts(width=1, prompt_len=1)
    assert not memory.repeated([4], [4, 5])  # position 1 had context (4,); now (5,)
    assert memory.repeated([4], [4, 4])  # position 1 (drafted) had context (4,), as position 2 has
    assert not memory.repeated([4], [4])  # the draft was not remembered: no generated position yet
    assert memory.repeated([4, 4], [4, 4])  # committed now


def test_hf_window_matches_transformers_state_step_by_step():
    """HFContextWindow says a step is watermarked exactly where transformers' processor state changes the
    scores (HFSynthIDState, a line-by-line port of SynthIDTextWatermarkLogitsProcessor.__call__)."""
    mark = make_watermark(HF_SPEC, None, 64)
    gen = torch.Generator().manual_seed(5)
    generated = torch.randint(0, 6, (80,), generator=gen).tolist()  # a 6-token alphabet: repeats come often
    prompt = [11, 12, 13]
    state = SamplerState(SamplingParams(seed=1), prompt, {0})
    reference = HFSynthIDState(mark, batch_size=1)
    for step, token in enumerate(generated):
        history = prompt + generated[:step]
        scores = torch.randn(1, 64, generator=gen)
        changed = not torch.equal(reference(torch.tensor([history]), scores), scores)
        context, marked = row_context(mark, state, state.history)
        assert marked == changed, step
        assert context == reference.context[0].tolist()
        state.append(token)
    assert context_hash_value([3, 4]) == int(mark.context_hashes(torch.tensor([[3, 4]]))[0])


def test_hf_window_memory_is_the_window_not_the_whole_history():
    mark = make_watermark(HF_SPEC, None, 64)
    window = HFContextWindow(mark, prompt_len=0)
    history = [1, 2, 3] + [7] * 30 + [1, 2, 3]  # (1, 2) and (2, 3) last seen 30+ steps ago: out of the 16-wide window
    for end in range(len(history) + 1):
        _, marked = window.step(history[:end])
    assert marked is True


# ------------------------------------------------------------------ decoding methods

class _FakeEngine:
    vocab_size = V
    max_model_len = 64

    def prompt_ids(self, prompt):
        return list(prompt)


@pytest.mark.parametrize("decoding, spec, message", [
    (DecodingParams(beam=BeamConfig(num_beams=2)), "synthid:h=4", "beam search"),
    (DecodingParams(n=2), "gumbel:h=4", "n / best_of"),
    (DecodingParams(mbr=MBRConfig(num_candidates=2)), "gumbel:h=4", "MBR"),
])
def test_decoding_methods_a_sampling_watermark_cannot_serve_are_refused(decoding, spec, message):
    mark = make_watermark(spec, SECRET, V, "k")
    with pytest.raises(SamplingWatermarkError, match=message):
        decoding.run(_FakeEngine(), [1, 2, 3], SamplingParams(seed=1), mark)


# ------------------------------------------------------------------ speculative decoding: exact by replay



@pytest.mark.parametrize("spec", ["gumbel:h=2", "synthid:h=2,layers=8,top_k=0", "gumbel:h=1,dedup=false"])
def test_speculative_output_equals_the_engine_token_for_token(tiny_engine, spec):
    """Same seed, same tokens: the keyed race and each draw replayed at the drafted positions, both
    drafters, with penalties; the greedy engine output is not what is compared (these rows sample)."""
    mark = make_watermark(spec, SECRET, TINY_VOCAB, "k")
    params = [SamplingParams(seed=7 + i, max_new_tokens=40, ignore_eos=True, temperature=0.8, repetition_penalty=1.1)
              for i in range(len(TINY_PROMPTS))]
    refs = tiny_engine.generate(TINY_PROMPTS, params, mark)
    drafter_model = _tiny_llama(1, noise_from=tiny_engine.loaded.model)
    accepted = 0
    for kind in ("prompt_lookup", "draft"):
        for ids, p, ref in zip(TINY_PROMPTS, params, refs):
            drafter = PromptLookupDrafter(3, 1) if kind == "prompt_lookup" else ModelDrafter(drafter_model)
            out = speculative_decode(tiny_engine, ids, p, drafter, 4, mark)
            assert out.token_ids == ref.token_ids, (kind, ids)
            accepted += out.decoding_stats["accepted"]
    assert accepted > 0  # drafts were accepted: the multi-token path ran


def test_engine_refuses_greedy_with_a_sampling_watermark(tiny_engine):
    mark = make_watermark("gumbel:h=2", SECRET, TINY_VOCAB, "k")
    with pytest.raises(SamplingWatermarkError, match="temperature 0"):
        tiny_engine.submit(TINY_PROMPTS[0], SamplingParams(temperature=0.0), mark)
