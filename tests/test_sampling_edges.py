"""Sampler numerics at the edges: a temperature down to the smallest positive float
decodes greedily in every decoding path (``SamplingParams.greedy`` is what each path asks), never a
draw over logits that overflowed fp32; the paths that refuse greedy refuse it there too."""

from __future__ import annotations

import pytest

from generation.decoding.beam import check_beam_params
from generation.decoding.best_of import check_best_of_params
from generation.decoding.contrastive import ContrastiveConfig
from generation.sample.params import GREEDY_TEMPERATURE
from generation.sample.sampler import SamplingParams

TINY = [5e-324, 1e-300, 1e-38, GREEDY_TEMPERATURE / 2]


@pytest.mark.parametrize("temperature", TINY + [0.0])
def test_tiny_temperatures_are_greedy(temperature):
    assert SamplingParams(temperature=temperature).greedy


@pytest.mark.parametrize("temperature", [GREEDY_TEMPERATURE, 1e-3, 1.0])
def test_ordinary_temperatures_sample(temperature):
    assert not SamplingParams(temperature=temperature).greedy


@pytest.mark.parametrize("temperature", TINY)
def test_each_path_treats_a_tiny_temperature_as_greedy(temperature):
    params = SamplingParams(temperature=temperature)
    check_beam_params(params)  # beam search takes greedy params (it refuses temperatures other than 0 or 1)
    with pytest.raises(ValueError, match="greedy"):
        check_best_of_params(params, 2)
    from generation.decoding.mbr import MBRConfig, run_mbr

    with pytest.raises(ValueError, match="greedy"):
        run_mbr(None, [1], params, MBRConfig(num_candidates=2))


def test_a_tiny_amateur_temperature_is_refused():
    with pytest.raises(ValueError, match="amateur_temperature"):
        ContrastiveConfig(amateur_model="/nonexistent", amateur_temperature=1e-38)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1e-38, 5e-324])
def test_engine_and_speculative_decoding_at_a_tiny_temperature_equal_greedy(loaded, temperature):
    from generation.decoding.speculative.decode import speculative_decode
    from generation.decoding.speculative.drafters import PromptLookupDrafter
    from generation.engine import Engine

    engine = Engine(loaded, max_num_seqs=2, max_model_len=128)
    prompt = engine.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    greedy = engine.generate([prompt], SamplingParams(max_new_tokens=12, temperature=0.0, logprobs=0))[0]
    for seed in (1, 2):
        params = SamplingParams(max_new_tokens=12, temperature=temperature, seed=seed, logprobs=0)
        (out,) = engine.generate([prompt], params)
        assert out.token_ids == greedy.token_ids
        assert all(lp > -50 for lp in out.logprobs)  # finite, the chosen tokens' own log-probabilities
        spec = speculative_decode(engine, prompt, params, PromptLookupDrafter(3, 2), 3, None)
        assert spec.token_ids == greedy.token_ids
