"""generation.decoding.contrastive: the score rule on crafted distributions, config validation, and runs
on the embedded model (expert) against itself and against a 4-layer early-exit copy of it (amateur)."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from generation.decoding.contrastive import (
    ContrastiveConfig,
    contrastive_scores,
    run_contrastive,
)
from generation.models import LoadedModel
from generation.sample.sampler import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

AMATEUR_LAYERS = 4  # of the expert's 30: much weaker, same tokenizer and embeddings
LOGP_TOLERANCE = 1e-4  # incremental (cached) vs one-pass forward differ by float rounding, ~1e-6 in logp
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]


def _fake_loaded() -> LoadedModel:
    return LoadedModel(torch.nn.Linear(1, 1), None, "fake", torch.device("cpu"), torch.float32)


# ------------------------------------------------------------------------------ no model needed
LOADED = "<a loaded model>"  # replaced by a LoadedModel inside the test (parametrize ids stay readable)


@pytest.mark.parametrize("kwargs, field", [
    ({}, "amateur_model"),  # no amateur at all
    ({"amateur_model": "/x", "amateur": LOADED}, "amateur_model"),  # two amateurs
    ({"amateur_model": ""}, "amateur_model"),
    ({"amateur": object()}, "amateur"),
    ({"amateur_model": "/x", "alpha": 0.0}, "alpha"),
    ({"amateur_model": "/x", "alpha": 1.5}, "alpha"),
    ({"amateur_model": "/x", "alpha": float("nan")}, "alpha"),
    ({"amateur_model": "/x", "beta": -0.1}, "beta"),
    ({"amateur_model": "/x", "beta": True}, "beta"),
    ({"amateur_model": "/x", "amateur_temperature": 0.0}, "amateur_temperature"),
    ({"amateur_model": "/x", "amateur_temperature": float("inf")}, "amateur_temperature"),
    ({"amateur_model": "/x", "watermark_before_cut": 1}, "watermark_before_cut"),
])
def test_bad_configs_name_the_field(kwargs, field):
    kwargs = {k: _fake_loaded() if v is LOADED else v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=rf"ContrastiveConfig\.{field}="):
        ContrastiveConfig(**kwargs)


def test_loaded_amateur_stays_out_of_repr():
    config = ContrastiveConfig(amateur=_fake_loaded(), beta=0.5)
    assert "amateur=" not in repr(config).replace("amateur_model=", "")
    assert "beta=0.5" in repr(config)


def test_scores_follow_li_et_al_on_a_crafted_distribution():
    expert = torch.tensor([[0.50, 0.30, 0.12, 0.049, 0.031]]).log()
    amateur = torch.tensor([[0.70, 0.05, 0.15, 0.0001, 0.0999]]).log()
    scores = contrastive_scores(expert, amateur, alpha=0.1, beta=1.0)
    # plausible: p >= 0.1 * 0.5 = 0.05 -> tokens 0, 1, 2; token 3 (0.049) is cut though the amateur hates it
    assert torch.isinf(scores[0, 3:]).all() and torch.isfinite(scores[0, :3]).all()
    expected = [math.log(0.5 / 0.7), math.log(0.3 / 0.05), math.log(0.12 / 0.15)]
    assert scores[0, :3].tolist() == pytest.approx(expected, rel=1e-5)
    assert int(scores.argmax()) == 1  # the expert's second choice, which the amateur finds unlikely
    half = contrastive_scores(expert, amateur, alpha=0.1, beta=0.5)
    assert half[0, 1].item() == pytest.approx(math.log(0.3) - 0.5 * math.log(0.05), rel=1e-5)
    plain = contrastive_scores(expert, amateur, alpha=0.1, beta=0.0)
    assert int(plain.argmax()) == 0 and plain[0, :3].tolist() == pytest.approx(expert[0, :3].tolist())


def test_alpha_one_keeps_only_the_expert_top_and_amateur_minus_inf_stays_finite():
    expert = torch.tensor([[0.6, 0.4, 0.0]]).log()
    amateur = torch.tensor([[0.0, 1.0, 0.0]]).log()  # -inf for tokens 0 and 2
    scores = contrastive_scores(expert, amateur, alpha=1.0, beta=1.0)
    assert torch.isfinite(scores[0, 0]) and torch.isinf(scores[0, 1:]).all()
    assert scores[0, 0].item() < 1e5  # floored amateur: a large finite score, not +inf


# ------------------------------------------------------------------------------ the embedded model
@pytest.fixture(scope="module")
def engine(loaded):
    from generation.engine import Engine

    return Engine(loaded, max_num_seqs=4, max_model_len=512)


@pytest.fixture(scope="module")
def early_exit(loaded):
    """The expert's first AMATEUR_LAYERS layers with its own embeddings, norm and head: an amateur."""
    config = copy.deepcopy(loaded.model.config)
    config.num_hidden_layers = AMATEUR_LAYERS
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:AMATEUR_LAYERS]
    small = type(loaded.model)(config)
    small.load_state_dict(loaded.model.state_dict(), strict=False)  # the dropped layers' weights are unused
    small.eval()
    return LoadedModel(small, loaded.vocab, f"early-exit-{AMATEUR_LAYERS}", loaded.device, loaded.dtype)


@pytest.fixture(scope="module")
def prompt(engine):
    return engine.apply_chat_template(PROMPT)


def _expert_logp(loaded, prompt, output):
    """Expert log-probabilities [len(output), V] of every decoding step, from one uncached forward pass."""
    with torch.inference_mode():
        ids = torch.tensor([prompt + output])
        logits = loaded.model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1)


def _assert_plausible(logp, output, alpha):
    chosen = logp.gather(1, torch.tensor(output)[:, None])[:, 0]
    margin = chosen - (logp.amax(-1) + math.log(alpha))
    assert bool((margin >= -LOGP_TOLERANCE).all()), [round(m, 4) for m in margin.tolist()]


FREE_TOKENS = 20  # enough steps for the amateur to override the expert; each costs two forwards


@pytest.fixture(scope="module")
def free_run(engine, early_exit, prompt):
    """Greedy CD with the early-exit amateur, no stops: shared by the plausibility and stop tests."""
    params = SamplingParams(max_new_tokens=FREE_TOKENS, temperature=0.0, ignore_eos=True)
    (out,) = run_contrastive(engine, prompt, params, ContrastiveConfig(amateur=early_exit, alpha=0.1, beta=1.0))
    return out


@pytest.mark.slow
def test_beta_zero_is_greedy_with_the_model_itself_as_amateur(engine, loaded, prompt):
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    (greedy,) = engine.generate([prompt], params)
    (cd,) = run_contrastive(engine, prompt, params, ContrastiveConfig(amateur=loaded, beta=0.0))
    assert cd.token_ids == greedy.token_ids and cd.text == greedy.text
    assert cd.finish_reason == greedy.finish_reason and cd.usage == greedy.usage
    assert cd.decoding_stats["expert_argmax_overrides"] == 0


@pytest.mark.slow
def test_early_exit_amateur_keeps_every_choice_plausible(loaded, prompt, free_run):
    assert len(free_run.token_ids) == FREE_TOKENS and free_run.finish_reason == "length"
    logp = _expert_logp(loaded, prompt, free_run.token_ids)
    _assert_plausible(logp, free_run.token_ids, 0.1)
    chosen = logp.gather(1, torch.tensor(free_run.token_ids)[:, None])[:, 0]
    assert free_run.cumulative_logprob == pytest.approx(float(chosen.sum()), abs=1e-2)
    assert free_run.decoding_stats["expert_argmax_overrides"] > 0  # the amateur changed some choices


@pytest.mark.slow
@pytest.mark.parametrize("amateur_name, alpha", [("expert", 0.1), ("early_exit", 0.5)])
def test_every_chosen_token_is_plausible(engine, loaded, early_exit, prompt, amateur_name, alpha):
    amateur = early_exit if amateur_name == "early_exit" else loaded
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    (cd,) = run_contrastive(engine, prompt, params, ContrastiveConfig(amateur=amateur, alpha=alpha, beta=1.0))
    _assert_plausible(_expert_logp(loaded, prompt, cd.token_ids), cd.token_ids, alpha)


@pytest.mark.slow
def test_sampled_contrastive_is_reproducible_and_plausible(engine, loaded, early_exit, prompt):
    params = SamplingParams(max_new_tokens=12, temperature=0.8, seed=3, ignore_eos=True, logprobs=2)
    config = ContrastiveConfig(amateur=early_exit, alpha=0.2)
    (first,) = run_contrastive(engine, prompt, params, config)
    (second,) = run_contrastive(engine, prompt, params, config)
    assert first.token_ids == second.token_ids and len(first.token_ids) == 12
    _assert_plausible(_expert_logp(loaded, prompt, first.token_ids), first.token_ids, 0.2)
    assert len(first.logprobs) == 12 and all(len(top) == 2 for top in first.top_logprobs)


HARD_SPEC = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,hard"


def _hard_run(engine, early_exit, prompt, before_cut):
    from watermark.scheme import generation_watermark

    wm = generation_watermark(HARD_SPEC, engine.vocab_size, create_if_missing=True)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    config = ContrastiveConfig(amateur=early_exit, watermark_before_cut=before_cut)
    (cd,) = run_contrastive(engine, prompt, params, config, watermark=wm)
    assert cd.watermark is not None and cd.watermark.key_id == wm.key_id
    full = prompt + cd.token_ids
    steps = range(len(cd.token_ids))
    contexts = torch.tensor([full[len(prompt) + i - wm.context_width:len(prompt) + i] for i in steps])
    return cd, wm.green_mask(contexts)  # [steps, V]


@pytest.mark.slow
def test_hard_watermark_on_scores_picks_green_whenever_the_plausible_set_has_one(engine, loaded, early_exit, prompt):
    cd, green = _hard_run(engine, early_exit, prompt, before_cut=False)
    logp = _expert_logp(loaded, prompt, cd.token_ids)
    _assert_plausible(logp, cd.token_ids, 0.1)  # the unbiased cut still holds
    # "clearly" plausible: a margin over the cut so float rounding cannot put a token on the other side
    clear = logp >= logp.amax(-1, keepdim=True) + math.log(0.1) + LOGP_TOLERANCE
    chosen_green = green[torch.arange(len(cd.token_ids)), cd.token_ids]
    assert bool((chosen_green | ~(clear & green).any(-1)).all())
    assert bool(chosen_green.any())


@pytest.mark.slow
def test_hard_watermark_before_the_cut_keeps_cd_among_green_tokens(engine, loaded, early_exit, prompt):
    cd, green = _hard_run(engine, early_exit, prompt, before_cut=True)
    logp = _expert_logp(loaded, prompt, cd.token_ids)
    assert bool(green[torch.arange(len(cd.token_ids)), cd.token_ids].all())
    _assert_plausible(logp.masked_fill(~green, float("-inf")), cd.token_ids, 0.1)  # plausible among the green


@pytest.mark.slow
def test_stops_are_honoured(engine, early_exit, prompt, free_run):
    config = ContrastiveConfig(amateur=early_exit, alpha=0.1, beta=1.0)
    (short,) = run_contrastive(engine, prompt, SamplingParams(max_new_tokens=3, temperature=0.0), config)
    assert short.token_ids == free_run.token_ids[:3] and short.finish_reason == "length"
    stop_token = free_run.token_ids[2]
    (by_id,) = run_contrastive(engine, prompt, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                              stop_token_ids=[stop_token]), config)
    first = free_run.token_ids.index(stop_token)
    assert by_id.token_ids == free_run.token_ids[:first + 1] and by_id.finish_reason == "stop"
    word = free_run.text.split()[2]
    (by_text,) = run_contrastive(engine, prompt, SamplingParams(max_new_tokens=FREE_TOKENS, temperature=0.0,
                                                                stop=[word]), config)
    assert by_text.finish_reason == "stop" and by_text.text == free_run.text[:free_run.text.index(word)]


@pytest.mark.slow
def test_amateur_must_share_the_tokenizer(engine, loaded, prompt):
    from transformers import LlamaConfig, LlamaForCausalLM

    tiny = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1))
    other = LoadedModel(tiny.eval(), loaded.vocab, "tiny", loaded.device, loaded.dtype)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    with pytest.raises(ValueError, match="vocab_size 1000.*must share the tokenizer"):
        run_contrastive(engine, prompt, params, ContrastiveConfig(amateur=other))
    renamed = LoadedModel(loaded.model, dataclasses.replace(loaded.vocab, fingerprint="0" * 64), "retokenized",
                          loaded.device, loaded.dtype)
    with pytest.raises(ValueError, match="tokenizer differs"):
        run_contrastive(engine, prompt, params, ContrastiveConfig(amateur=renamed))


@pytest.mark.slow
def test_request_incompatibilities_name_the_setting(engine, loaded, prompt):
    config = ContrastiveConfig(amateur=loaded)
    with pytest.raises(ValueError, match="mirostat_mode=2"):
        run_contrastive(engine, prompt, SamplingParams(max_new_tokens=4, mirostat_mode=2), config)
    from generation.constraints.constraint import ConstraintSpec

    with pytest.raises(ValueError, match="constraint"):
        run_contrastive(engine, prompt, SamplingParams(max_new_tokens=4, constraint=ConstraintSpec(regex="[ab]+")), config)
    with pytest.raises(ValueError, match="prompt"):
        run_contrastive(engine, [], SamplingParams(max_new_tokens=4), config)
