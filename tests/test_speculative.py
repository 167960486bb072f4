"""Speculative decoding (generation/decoding/speculative*.py): exactness of the acceptance step on crafted
distributions, greedy token-identity with the engine, the sampled distribution on the real model, and
watermark detection of speculative output.

Statistical tests: each compares observed counts with the exact distribution by Pearson's chi-square
(bins with expected count < MIN_EXPECTED pooled into one) and fails when the p-value is below
FALSE_ALARM, so a correct sampler fails a given test with probability 1e-4 (the chi-square law is
asymptotic; with expected counts >= 5 per bin its tail is accurate well beyond this level). Seeds are
fixed, so every run draws the same numbers. Each test also shows that the same check rejects a wrong
sampler (the drafter's own distribution), so the checks have power."""

from __future__ import annotations

import types

import pytest
import torch
from scipy.stats import chi2

from generation.decoding.speculative.decode import (
    SpeculativeConfig,
    run_speculative,
    speculative_decode,
)
from generation.decoding.speculative.drafters import load_draft_model, prompt_lookup
from generation.decoding.speculative.verify import (
    draw_token,
    verify_round,
    verify_round_greedy,
    verify_token,
)
from generation.sample.sampler import SamplingParams
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FALSE_ALARM = 1e-4  # per test: probability that a correct sampler fails the chi-square check
MIN_EXPECTED = 5.0  # Cochran's rule: chi-square is accurate when every bin expects >= 5 counts
DRAWS = 10_000  # crafted-distribution draws per case (~1 s each)
TEST_SECRET = bytes(range(32))  # a fixed throwaway key: tests only, never a keyring secret
CRAFTED_VOCAB = 8


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square p-value of ``counts`` against ``probs`` (small-expectation bins pooled)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    expected = probs / probs.sum() * counts.sum()
    big = expected >= MIN_EXPECTED
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    if float(observed[~keep].sum()) > 0:
        return 0.0  # a count where the law puts no mass: impossible under the null
    observed, expected = observed[keep], expected[keep]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return float(chi2.sf(statistic, observed.numel() - 1))


# ------------------------------------------------------------------ crafted distributions


def _crafted(seed: int) -> torch.Tensor:
    return torch.randn(CRAFTED_VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5


def _watermarked(logits: torch.Tensor) -> torch.Tensor:
    """softmax of logits biased by the default spec's watermark after a fixed 4-token history."""
    wm = Watermark(WatermarkSpec.default(), TEST_SECRET, CRAFTED_VOCAB, key_id="test")
    biased = wm.bias(logits.clone()[None], [[1, 2, 3, 4]])[0]
    assert not torch.allclose(biased, logits), "the watermark must change this distribution"
    return biased.softmax(-1)


CASES = {
    "plain p, model drafter": lambda: (_crafted(1).softmax(-1), _crafted(2).softmax(-1)),
    "watermarked p, unwatermarked drafter": lambda: (_watermarked(_crafted(3)), _crafted(3).softmax(-1)),
    "watermarked p, watermarked drafter": lambda: (_watermarked(_crafted(4)), _watermarked(_crafted(5))),
    "watermarked p, prompt lookup (one-hot q)": lambda: (_watermarked(_crafted(6)), None),
}


def _verify_draws(p: torch.Tensor, q: torch.Tensor | None, lookup_token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts of verify_token's output over DRAWS drafts, and counts of the drafts themselves."""
    drafter, request = torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)
    out = torch.zeros(p.shape[0])
    drafted = torch.zeros(p.shape[0])
    for _ in range(DRAWS):
        x = draw_token(q, drafter) if q is not None else lookup_token
        _, token = verify_token(p, q, x, request)
        out[token] += 1
        drafted[x] += 1
    return out, drafted


@pytest.mark.parametrize("case", list(CASES))
def test_verified_token_is_distributed_as_target(case):
    p, q = CASES[case]()
    counts, drafted = _verify_draws(p, q)
    assert chi_square_p_value(counts, p) > FALSE_ALARM
    if q is not None:
        assert not torch.allclose(p, q, atol=0.02), "q must differ from p for the test to mean anything"
        assert chi_square_p_value(drafted, p) < FALSE_ALARM  # the check has power: q's own draws fail it


def test_one_hot_proposal_keeps_the_draft_with_probability_p():
    p = _watermarked(_crafted(7))
    request = torch.Generator().manual_seed(3)
    kept = sum(verify_token(p, None, 2, request)[0] for _ in range(DRAWS))
    # binomial(DRAWS, p[2]): two-sided bound at FALSE_ALARM by the normal tail (z = 3.89)
    sd = (DRAWS * float(p[2]) * (1 - float(p[2]))) ** 0.5
    assert abs(kept - DRAWS * float(p[2])) < 3.9 * sd


def test_a_round_of_two_drafts_gives_the_target_joint_distribution():
    """Two positions of a crafted 4-token Markov target and drafter: the first two output tokens of a
    round (completed by a plain draw when the round stops after one) follow p(x1) p(x2 | x1)."""
    vocab = 4
    g = torch.Generator().manual_seed(21)
    p1, q1 = torch.randn(vocab, generator=g).softmax(-1), torch.randn(vocab, generator=g).softmax(-1)
    p2, q2 = torch.randn(vocab, vocab, generator=g).softmax(-1), torch.randn(vocab, vocab, generator=g).softmax(-1)
    p3 = torch.full((vocab,), 1.0 / vocab)  # the bonus position: its law does not enter (x1, x2)
    drafter, request = torch.Generator().manual_seed(22), torch.Generator().manual_seed(23)
    counts = torch.zeros(vocab, vocab)
    wrong = torch.zeros(vocab, vocab)
    for _ in range(DRAWS):
        d1 = draw_token(q1, drafter)
        d2 = draw_token(q2[d1], drafter)
        accepted, token = verify_round(torch.stack([p1, p2[d1], p3]), torch.stack([q1, q2[d1]]), [d1, d2], request)
        tokens = [d1, d2][:accepted] + [token]
        if len(tokens) == 1:
            tokens.append(draw_token(p2[tokens[0]], request))
        counts[tokens[0], tokens[1]] += 1
        wrong[d1, d2] += 1
    joint = p1[:, None] * p2
    assert chi_square_p_value(counts, joint) > FALSE_ALARM
    assert chi_square_p_value(wrong, joint) < FALSE_ALARM


def test_greedy_round_keeps_drafts_up_to_the_first_mismatch():
    rows = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    assert verify_round_greedy(rows, [1, 0]) == (2, 2)  # all kept: bonus is row 2's argmax
    assert verify_round_greedy(rows, [1, 2]) == (1, 0)  # second differs: replaced by the argmax
    assert verify_round_greedy(rows[:1], []) == (0, 1)


def test_prompt_lookup_copies_what_followed_the_most_recent_match():
    assert prompt_lookup([1, 2, 3, 4, 1, 2], 3, 3, 1) == [3, 4, 1]
    assert prompt_lookup([5, 1, 9, 5, 1, 7, 5, 1], 2, 2, 1) == [7, 5]  # most recent [5, 1] is at 3..4
    assert prompt_lookup([1, 2, 3, 4], 5, 3, 1) == []
    assert prompt_lookup([7, 8, 7, 9, 7], 3, 3, 2) == []  # only a 1-gram matches, below the minimum
    assert prompt_lookup([7, 8, 7, 9, 7], 3, 3, 1) == [9, 7]


# ------------------------------------------------------------------ configuration errors


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "medusa"}, "method"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 65}, "num_speculative_tokens"),
    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 1, "prompt_lookup_min": 2}, "prompt_lookup_max"),
    ({"method": "draft"}, "draft_model"),
    ({"method": "draft", "draft_model": " "}, "draft_model"),
    ({"method": "prompt_lookup", "draft_model": "default"}, "draft_model"),
])
def test_bad_configs_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"SpeculativeConfig.{field}="):
        SpeculativeConfig(**kwargs)


def test_inexact_sampling_options_are_refused():
    with pytest.raises(ValueError, match="mirostat_mode"):
        run_speculative(None, [1, 2], SamplingParams(mirostat_mode=2), SpeculativeConfig())
    from generation.constraints.constraint import ConstraintSpec

    with pytest.raises(ValueError, match="constraint"):
        run_speculative(None, [1, 2], SamplingParams(constraint=ConstraintSpec(regex="[ab]+")), SpeculativeConfig())
    with pytest.raises(TypeError, match="SpeculativeConfig"):
        run_speculative(None, [1, 2], SamplingParams(), {"method": "prompt_lookup"})


def _fake_target(vocab_size: int, fingerprint: str):
    return types.SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, vocab=types.SimpleNamespace(fingerprint=fingerprint),
                                 model=types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=vocab_size)))


@pytest.mark.parametrize("vocab_size, fingerprint, message", [(100, "same", "vocab size 100"), (49152, "other", "tokenizer differs")])
def test_draft_model_must_share_the_vocabulary(monkeypatch, vocab_size, fingerprint, message):
    from generation.decoding.speculative import drafters

    # the drafter's own name for the loader (it imports load_model at its top)
    monkeypatch.setattr(drafters, "load_model", lambda name, device, dtype: _fake_target(vocab_size, fingerprint))
    with pytest.raises(ValueError, match=f"SpeculativeConfig.draft_model=.*{message}"):
        load_draft_model(f"fake-{vocab_size}-{fingerprint}", _fake_target(49152, "same"))


# ------------------------------------------------------------------ a tiny random Llama (cheap, exact checks)

TINY_VOCAB = 16
TINY_EOS = 2
TINY_PROMPTS = [[1, 5, 6, 7, 5, 6], [1, 9, 9, 9, 9], [1, 3, 4, 8, 11, 13, 3, 4]]
TINY_RUNS = 300  # sampled end-to-end runs per drafter (~30 ms each on an idle core)


class LetterTokenizer:
    """Token i decodes to the i-th lowercase letter: enough for TextTracker and stop strings."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(ord("a") + int(i)) for i in ids)


def _tiny_llama(seed: int, noise_from: torch.nn.Module | None = None) -> torch.nn.Module:
    """A 1-layer random Llama over TINY_VOCAB tokens with a sharpened head (peaked, varied distributions);
    with ``noise_from``, a noisy copy of that model instead (a drafter that often, not always, agrees)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=TINY_EOS, bos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        if noise_from is not None:
            model.load_state_dict(noise_from.state_dict())
            for weight in model.parameters():
                weight.add_(torch.randn_like(weight) * 0.3 * weight.std())
        else:
            model.lm_head.weight.mul_(20.0)  # init std 0.02 gives near-uniform logits
    return model


@pytest.fixture(scope="module")
def tiny_engine():
    return make_tiny_engine()


def make_tiny_engine():
    """An engine over a tiny random Llama and a letter tokenizer (no model weights to load)."""
    from generation.engine import Engine
    from generation.models import LoadedModel

    vocab = types.SimpleNamespace(tokenizer=LetterTokenizer(), eos_token_id=TINY_EOS, fingerprint="tiny")
    loaded = LoadedModel(model=_tiny_llama(0), vocab=vocab, model_id="tiny", device=torch.device("cpu"),
                         dtype=torch.float32)
    return Engine(loaded, max_num_seqs=4, max_model_len=128)


@pytest.fixture(scope="module")
def tiny_drafter_model(tiny_engine):
    return _tiny_llama(1, noise_from=tiny_engine.loaded.model)


@pytest.fixture(scope="module")
def tiny_watermark():
    return Watermark(WatermarkSpec.default(), TEST_SECRET, TINY_VOCAB, key_id="test")


def _drafter(kind: str, model=None):
    from generation.decoding.speculative.drafters import (
        ModelDrafter,
        PromptLookupDrafter,
    )

    return PromptLookupDrafter(3, 1) if kind == "prompt_lookup" else ModelDrafter(model)


GREEDY_VARIANTS = {
    "plain": {"max_new_tokens": 60, "ignore_eos": True},
    "penalties": {"max_new_tokens": 60, "ignore_eos": True, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                      "frequency_penalty": 0.3, "no_repeat_ngram_size": 3, "bad_words_ids": [[4, 14]], "logit_bias": {7: 1.5}},
    "stops": {"max_new_tokens": 60, "min_new_tokens": 5, "stop": ["fij"], "stop_token_ids": [12], "logprobs": 2},
    "eos": {"max_new_tokens": 60, "min_new_tokens": 3},
}


@pytest.mark.parametrize("marked", [False, True], ids=["plain", "watermarked"])
@pytest.mark.parametrize("variant", list(GREEDY_VARIANTS))
def test_tiny_greedy_speculative_equals_engine_greedy(tiny_engine, tiny_drafter_model, tiny_watermark, variant, marked):
    """Penalties, bans and the watermark at each drafted position, stop strings and stop ids inside an
    accepted run, min_new_tokens: all as the engine does them, token for token."""
    params = SamplingParams(temperature=0.0, **GREEDY_VARIANTS[variant])
    wm = tiny_watermark if marked else None
    refs = tiny_engine.generate(TINY_PROMPTS, params, wm)
    for kind in ("prompt_lookup", "draft"):
        accepted = 0
        for ids, ref in zip(TINY_PROMPTS, refs):
            out = speculative_decode(tiny_engine, ids, params, _drafter(kind, tiny_drafter_model), 4, wm)
            assert out.token_ids == ref.token_ids, (kind, ids)
            assert (out.text, out.finish_reason) == (ref.text, ref.finish_reason), (kind, ids)
            if ref.logprobs is not None:
                assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
                assert [[t for t, _ in r] for r in out.top_logprobs] == [[t for t, _ in r] for r in ref.top_logprobs]
            accepted += out.decoding_stats["accepted"]
        assert accepted > 0, kind  # drafts were accepted, so the multi-token path was exercised


def _reference_law(engine, model, params: SamplingParams, history: list[int], prompt_len: int, watermark) -> torch.Tensor:
    """The engine's sampling distribution after ``history``, assembled here from the sampler's stages."""
    from generation.sample.sampler import (
        SamplerState,
        apply_bans_,
        apply_penalties_,
        truncate_,
    )

    state = SamplerState(params, history[:prompt_len], engine.eos_token_ids)
    for token in history[prompt_len:]:
        state.append(token)
    with torch.inference_mode():
        logits = model(torch.tensor([history])).logits[0, -1:].float()
    scores = logits.clone()  # outside inference mode: the stages write in place
    apply_penalties_(scores, [state])
    apply_bans_(scores, [state])
    watermark.bias(scores, [history])
    scores /= params.temperature
    truncate_(scores, [params])
    return scores.softmax(-1)[0]


@pytest.mark.parametrize("kind", ["prompt_lookup", "draft"])
def test_tiny_sampled_speculative_matches_the_target_law(tiny_engine, tiny_drafter_model, tiny_watermark, kind):
    """The first two tokens (of three, so a round verifies two drafts) over TINY_RUNS seeds, watermarked
    and penalised, vs the exact law p(x1) p(x2 | x1) of the engine's pipeline."""
    base = {"max_new_tokens": 3, "temperature": 0.9, "top_k": 4, "repetition_penalty": 1.2, "presence_penalty": 0.4, "ignore_eos": True}
    # a prompt ending in the model's own greedy cycle: its lookups are often, not always, accepted
    cycle = tiny_engine.generate([TINY_PROMPTS[0]], SamplingParams(max_new_tokens=30, temperature=0.0, ignore_eos=True),
                                 tiny_watermark)[0].token_ids
    prompt = [1] + cycle[10:]
    model = tiny_engine.loaded.model
    p1 = _reference_law(tiny_engine, model, SamplingParams(**base), prompt, len(prompt), tiny_watermark)
    joint = torch.zeros(TINY_VOCAB, TINY_VOCAB)
    for a in p1.nonzero()[:, 0].tolist():
        joint[a] = p1[a] * _reference_law(tiny_engine, model, SamplingParams(**base), prompt + [a], len(prompt), tiny_watermark)
    counts = torch.zeros(TINY_VOCAB, TINY_VOCAB)
    stats = {"proposed": 0, "accepted": 0}
    for seed in range(TINY_RUNS):
        out = speculative_decode(tiny_engine, prompt, SamplingParams(**base, seed=seed),
                                 _drafter(kind, tiny_drafter_model), 4, tiny_watermark)
        counts[out.token_ids[0], out.token_ids[1]] += 1
        for key in stats:
            stats[key] += out.decoding_stats[key]
    assert 0 < stats["accepted"] < stats["proposed"]  # both acceptances and rejections happened
    assert chi_square_p_value(counts, joint) > FALSE_ALARM


# ------------------------------------------------------------------ the embedded model

NEW_TOKENS = 32
PASSAGE = ("The river flooded the old mill in the spring of 1890. The miller, Thomas Hale, rebuilt it with stone "
           "from the quarry on the hill, and the new mill ran for sixty years before it closed in 1950.")


@pytest.fixture(scope="module")
def engine(loaded):
    from generation.engine import Engine

    return Engine(loaded, max_num_seqs=2, max_model_len=512)


@pytest.fixture(scope="module")
def rewrite_prompt(engine):
    return engine.apply_chat_template([{"role": "user", "content": f"Rewrite this passage in your own words:\n\n{PASSAGE}"}])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["prompt_lookup", "draft"])
def test_greedy_speculative_equals_engine_greedy(engine, rewrite_prompt, method):
    """The embedded model, with and without the default watermark; the draft model is the embedded model
    loaded a second time (shares the tokenizer). It costs a forward per draft, so it runs watermarked
    only (the tiny-model tests cover both drafters without a watermark)."""
    wm = Watermark(WatermarkSpec.default(), TEST_SECRET, engine.vocab_size, key_id="test")
    config = SpeculativeConfig(method, draft_model="default" if method == "draft" else None)
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    for mark in ((None, wm) if method == "prompt_lookup" else (wm,)):
        ref = engine.generate([rewrite_prompt], params, mark)[0]
        out, = run_speculative(engine, rewrite_prompt, params, config, mark)
        assert out.token_ids == ref.token_ids
        assert (out.text, out.finish_reason) == (ref.text, ref.finish_reason)
        assert (out.watermark is not None) == (mark is not None)
        stats = out.decoding_stats
        assert stats["drafter"] == method and stats["accepted"] > 0
        assert stats["target_forwards"] < len(out.token_ids)  # speculation saved target forwards


@pytest.mark.slow
def test_watermarked_speculative_output_is_detected(engine, fixed_key):
    from detector.service import Detector
    from generation.decoding.speculative.drafters import PromptLookupDrafter
    from watermark.scheme import generation_watermark

    wm = generation_watermark(None, engine.vocab_size)  # fixed_key: this test's own keyring
    ids = engine.apply_chat_template([{"role": "user", "content": f"Continue this story: {PASSAGE}"}])
    params = SamplingParams(max_new_tokens=200, min_new_tokens=200, temperature=1.0, seed=7)
    out = speculative_decode(engine, ids, params, PromptLookupDrafter(3, 2), 3, wm)
    assert len(out.token_ids) == 200 and out.decoding_stats["proposed"] > 0
    verdict = Detector().detect(out.text)
    assert verdict.watermarked and verdict.z_score >= 4.0, verdict.z_score
