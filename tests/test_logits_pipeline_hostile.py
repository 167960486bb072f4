"""Every decoding method through the hostile inputs the engine's sampler survives.

Hostile: temperature 1e-30 (greedy) and 1e30, repetition penalty 1e-190 (seen positive logits pushed
past the float range), logit_bias of +-100 on thousands of ids. Each method must finish with valid
tokens and finite logprobs, and its processed distribution must equal the engine's pipeline on the
same state. The distributions are compared through shared randomness: every path draws a token by
inverse CDF from one uniform of the request's seeded generator (generation.sample.sampler.draw_), so two
paths given the same seed pick the same token at every step exactly when their distributions agree
at that uniform; a path whose logits overflowed (inf, then NaN probabilities) picks garbage instead.
Under these inputs the distributions are flat over a set (the tokens that overflowed, or every
unbanned token at T = 1e30), so float rounding between the engine's runner and a method's own
forward cannot move a token.

A tiny random Llama over VOCAB tokens keeps this fast; ``engine.generate`` is the reference.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from generation.decoding.beam import BeamConfig, run_beam
from generation.decoding.best_of import run_best_of
from generation.decoding.contrastive import ContrastiveConfig, run_contrastive
from generation.decoding.mbr import MBRConfig, candidate_seed, run_mbr
from generation.decoding.speculative.decode import speculative_decode
from generation.decoding.speculative.drafters import (
    ModelDrafter,
    NoDrafter,
    PromptLookupDrafter,
)
from generation.sample.sampler import SamplingParams
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

VOCAB = 4096  # "thousands of ids" under logit_bias need a vocabulary of thousands
EOS = 2
SECRET = bytes(range(32))
PROMPTS = [[1, 5, 6, 7, 5, 6, 300, 301, 4000], [1, 9, 9, 9, 9, 2500, 17, 18]]
SEEDS = range(6)
NEW_TOKENS = 6
BIAS = {**{i: 100.0 for i in range(100, 2100)}, **{i: -100.0 for i in range(2100, VOCAB)}}
HOSTILE = {  # name: SamplingParams fields; ignore_eos so every run reaches NEW_TOKENS
    "tiny_temperature": dict(temperature=1e-30, repetition_penalty=1e-190, logit_bias=BIAS),
    "huge_temperature": dict(temperature=1e30, logit_bias=BIAS, presence_penalty=2.0),
    "overflow": dict(temperature=0.7, repetition_penalty=1e-190, logit_bias=BIAS),
    # (no top_p on a flat set: which tied tokens its cut keeps depends on the sort order of ties)
    "overflow_truncated": dict(temperature=0.5, repetition_penalty=1e-190, top_k=50, min_p=0.1),
}
TIES = ("tiny_temperature", "overflow", "overflow_truncated")  # the overflowed tokens tie at the float maximum


def _params(name: str, **overrides) -> SamplingParams:
    fields = dict(max_new_tokens=NEW_TOKENS, ignore_eos=True, logprobs=2, **HOSTILE[name])
    fields.update(overrides)
    return SamplingParams(**fields)


class _LetterTokenizer:
    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


def _tiny_llama(seed: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=EOS, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # init std 0.02 gives near-uniform logits
    return model


def _loaded(seed: int):
    from generation.models import LoadedModel

    vocab = types.SimpleNamespace(tokenizer=_LetterTokenizer(), eos_token_id=EOS, fingerprint="hostile")
    return LoadedModel(model=_tiny_llama(seed), vocab=vocab, model_id=f"hostile-{seed}", device=torch.device("cpu"),
                       dtype=torch.float32)


@pytest.fixture(scope="module")
def engine():
    from generation.engine import Engine

    return Engine(_loaded(0), max_num_seqs=4, max_model_len=128)


@pytest.fixture(scope="module")
def amateur():
    return _loaded(1)


@pytest.fixture(scope="module")
def mark():
    return Watermark(WatermarkSpec.default(), SECRET, VOCAB, key_id="hostile")


def _reference(engine, prompt, params, watermark):
    return engine.generate([prompt], params, watermark, use_tqdm=False)[0]


def _assert_sane(out, params):
    assert len(out.token_ids) == params.max_new_tokens
    assert all(0 <= t < VOCAB for t in out.token_ids)
    if out.logprobs is not None:  # reported from the penalised logits: finite, never NaN
        assert all(lp == lp and lp > float("-inf") for lp in out.logprobs), out.logprobs


def _sampled_cases():
    return [name for name in HOSTILE if not _params(name).greedy]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_the_engine_survives_each_hostile_input(engine, mark, name):
    params = _params(name, seed=0)
    for prompt in PROMPTS:
        _assert_sane(_reference(engine, prompt, params, mark), params)


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("marked", [False, True], ids=["plain", "watermarked"])
def test_speculative_without_drafts_draws_as_the_engine(engine, mark, name, marked):
    """No drafts: each round's one target distribution is drawn with the engine's one uniform."""
    wm = mark if marked else None
    for prompt in PROMPTS:
        for seed in SEEDS:
            params = _params(name, seed=seed)
            out = speculative_decode(engine, prompt, params, NoDrafter(), 4, wm)
            _assert_sane(out, params)
            assert out.token_ids == _reference(engine, prompt, params, wm).token_ids, (prompt, seed)


@pytest.mark.parametrize("name", list(HOSTILE))
@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft"])
def test_speculative_with_drafts_survives_and_is_exact_when_greedy(engine, amateur, mark, name, drafter):
    for prompt in PROMPTS:
        for seed in SEEDS[:2]:
            params = _params(name, seed=seed)
            chosen = PromptLookupDrafter(3, 1) if drafter == "prompt_lookup" else ModelDrafter(amateur.model)
            out = speculative_decode(engine, prompt, params, chosen, 4, mark)
            _assert_sane(out, params)
            if params.greedy:
                assert out.token_ids == _reference(engine, prompt, params, mark).token_ids
            elif params.repetition_penalty < 1.0:  # only seen tokens overflowed: the first token is one of them
                assert out.token_ids[0] in prompt, out.token_ids


@pytest.mark.parametrize("name", list(HOSTILE))
def test_contrastive_without_an_amateur_penalty_draws_as_the_engine(engine, amateur, name):
    """beta = 0 and the smallest alpha: the contrastive score is the expert's log-probability over every
    token the engine could draw, so the processed distribution is the engine's."""
    config = ContrastiveConfig(amateur=amateur, alpha=5e-324, beta=0.0)
    for prompt in PROMPTS:
        for seed in SEEDS:
            params = _params(name, seed=seed)
            (out,) = run_contrastive(engine, prompt, params, config, None)
            _assert_sane(out, params)
            assert out.token_ids == _reference(engine, prompt, params, None).token_ids, (prompt, seed)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_contrastive_survives_with_the_watermark_either_side_of_the_cut(engine, amateur, mark, name):
    for before_cut in (False, True):
        config = ContrastiveConfig(amateur=amateur, beta=1.0, watermark_before_cut=before_cut)
        params = _params(name, seed=3)
        (out,) = run_contrastive(engine, PROMPTS[0], params, config, mark)
        _assert_sane(out, params)


@pytest.mark.parametrize("name", list(HOSTILE))
def test_best_of_sibling_zero_draws_as_the_engine(engine, mark, name):
    for prompt in PROMPTS:
        for seed in SEEDS[:3]:
            params = _params(name, seed=seed)
            count = 1 if params.greedy else 2  # greedy siblings are refused
            outs = run_best_of(engine, prompt, params, count, count, mark)
            sibling0 = next(o for o in outs if o.decoding_stats["sibling"] == 0)
            _assert_sane(sibling0, params)
            assert sibling0.token_ids == _reference(engine, prompt, params, mark).token_ids
            assert all(o.cumulative_logprob == o.cumulative_logprob for o in outs)  # not NaN


@pytest.mark.parametrize("name", list(HOSTILE))
def test_one_beam_is_the_engines_greedy_path(engine, mark, name):
    """Beam search scores temperature-1 log-probabilities of the processed logits: one beam is greedy.
    Where tokens tie at the float maximum, beam's topk may take another of the tied tokens than argmax's
    first: there the first token must be one of them (a seen prompt token), not the same one."""
    params = _params(name, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, logprobs=None)
    for prompt in PROMPTS:
        (out,) = run_beam(engine, prompt, params, BeamConfig(1), mark)
        _assert_sane(out, params)
        assert out.cumulative_logprob == out.cumulative_logprob and out.cumulative_logprob > float("-inf")
        if name in TIES:
            assert out.token_ids[0] in prompt
        else:
            assert out.token_ids == _reference(engine, prompt, params, mark).token_ids
    (out,) = run_beam(engine, PROMPTS[0], params, BeamConfig(3), mark)
    _assert_sane(out, params)


@pytest.mark.parametrize("name", _sampled_cases())
def test_mbr_candidates_draw_as_the_engine(engine, mark, name):
    params = _params(name, seed=11)
    (out,) = run_mbr(engine, PROMPTS[0], params, MBRConfig(num_candidates=3), mark)
    _assert_sane(out, params)
    chosen = out.decoding_stats["chosen"]
    same_seed = dataclasses.replace(params, seed=candidate_seed(params.seed, chosen))
    assert out.token_ids == _reference(engine, PROMPTS[0], same_seed, mark).token_ids


def test_the_vllm_rows_bias_overflowed_logits_as_the_engines_watermark_stage(fixed_key):
    """The vLLM plugin applies only the watermark stage: on overflowed logits it biases as the engine."""
    from generation.vllm.rows import RequestWatermarks, WatermarkedBatch
    from watermark.processor import WatermarkProcessor
    from watermark.scheme import generation_watermark

    batch = WatermarkedBatch(RequestWatermarks(VOCAB))
    output_ids = [[], [7, 8, 9]]
    batch.update([], [(i, {}, PROMPTS[i], output_ids[i]) for i in range(2)], [])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    logits[:, :50] = torch.finfo(torch.float32).max
    logits[:, 50:100] = float("-inf")
    got = batch.apply(logits.clone())
    wm = generation_watermark(None, VOCAB)
    want = WatermarkProcessor().apply(logits.clone(), [PROMPTS[i] + output_ids[i] for i in range(2)], [wm, wm])
    assert torch.equal(got, want)
    assert not torch.isnan(got).any()


# ---- decoding sees the engine through its public interface only ----

class _PublicOnly:
    """The engine behind generation.decoding.engine_interface.DecodingEngine's members, and nothing else."""

    MEMBERS = {"vocab_size", "tokenizer", "eos_token_ids", "pipeline", "loaded", "max_model_len", "model",
               "prompt_ids", "branches", "generate"}

    def __init__(self, engine):
        object.__setattr__(self, "_engine", engine)

    def __getattr__(self, name):
        if name not in self.MEMBERS:
            raise AttributeError(f"decoding reached past the engine's public interface: engine.{name}")
        return getattr(object.__getattribute__(self, "_engine"), name)


def test_every_method_runs_over_the_public_engine_interface_alone(engine, amateur, mark):
    from generation.decoding import DecodingParams, run_decoding
    from generation.decoding.contrastive import ContrastiveConfig as Contrastive
    from generation.decoding.speculative.decode import SpeculativeConfig

    public = _PublicOnly(engine)
    sampled = _params("overflow", seed=5)
    greedy = _params("tiny_temperature", logprobs=None)
    for params, decoding in [
        (greedy, DecodingParams(beam=BeamConfig(2))),
        (sampled, DecodingParams(n=2, best_of=3)),
        (sampled, DecodingParams(speculative=SpeculativeConfig("prompt_lookup"))),
        (sampled, DecodingParams(contrastive=Contrastive(amateur=amateur))),
        (sampled, DecodingParams(mbr=MBRConfig(num_candidates=2))),
        (sampled, None),
    ]:
        outs = run_decoding(public, PROMPTS[0], params, decoding, mark)
        assert outs and all(len(o.token_ids) == params.max_new_tokens for o in outs)
        assert engine.decode(PROMPTS[0], params, decoding, mark)[0].token_ids  # the engine's own entry point


def test_the_engine_does_not_import_decoding():
    import subprocess
    import sys

    code = "import sys, generation.engine; print(sorted(m for m in sys.modules if m.startswith('generation.decoding')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
