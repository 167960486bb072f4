"""Decoding core: beam search, n/best_of, DecodingParams, Engine.decode (the branches over the engine's
KV pool they run on: tests/test_branches.py).

Against the real embedded model (fp32, one torch thread). Beam scores are re-computed here independently
(one branch, one token at a time) to check what the search reports and that wider beams score at least
as well as greedy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from generation.decoding import DecodingParams, run_decoding
from generation.decoding.beam import (
    BeamConfig,
    check_beam_params,
    run_beam,
)
from generation.decoding.best_of import run_best_of, sibling_seed
from generation.engine import Engine
from generation.sample import StepRows
from generation.sample.sampler import SamplerState, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

PROMPTS = ["The capital of France is", "Once upon a time, in a land far away, there lived a"]
NEW_TOKENS = 16
SCORE_TOLERANCE = 1e-3  # nats over 16 tokens of float32 log-softmax
Z_THRESHOLD = 4.0  # the detector's threshold: one-sided p ~ 3.2e-5


@pytest.fixture(scope="module")
def engine(loaded):
    return Engine(loaded, max_num_seqs=2, max_model_len=512)


TEST_SECRET = bytes(range(32))  # a fixed 256-bit key: every run scores and detects the same texts
TEST_KEY_ID = "k-decoding-test"


@pytest.fixture(scope="module")
def watermark(engine):
    """The default kgw spec under a fixed key (not a keyring's random one), so the tests are deterministic."""
    from watermark.config import WatermarkSpec
    from watermark.scheme import Watermark

    return Watermark(WatermarkSpec.default(), TEST_SECRET, engine.vocab_size, key_id=TEST_KEY_ID)


def ids_of(engine, text):
    return engine.tokenizer(text)["input_ids"]


def rescore(engine, prompt_ids, token_ids, params, watermark=None) -> float:
    """Sum of processed log-probabilities of ``token_ids``, one branch, fed one token at a time."""
    state = SamplerState(params, prompt_ids, engine.eos_token_ids)
    total = 0.0
    with engine.branches(prompt_ids, 1, max(len(token_ids), 1)) as runner:
        logits = runner.prefill()
        for i, token in enumerate(token_ids):
            total += float(engine.pipeline.ranking_logprobs(logits, StepRows.of([state], [watermark]))[0, token])
            state.append(token)
            if i + 1 < len(token_ids):
                logits = runner.step([token])
    return total


# ---- beam search ----------------------------------------------------------------------------------

@pytest.mark.parametrize("marked", [False, True], ids=["plain", "watermarked"])
def test_one_beam_is_greedy(engine, watermark, marked):
    wm = watermark if marked else None
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    for prompt in PROMPTS:
        (greedy,) = engine.generate([prompt], params, watermarks=[wm])
        (beam,) = engine.decode(prompt, params, DecodingParams(beam=BeamConfig(1)), watermark=wm)
        assert beam.token_ids == greedy.token_ids
        assert beam.text == greedy.text and beam.finish_reason == greedy.finish_reason
        assert (beam.watermark is not None) == marked


@pytest.mark.parametrize(("num_beams", "early_stopping"), [(4, False), (3, True)])
def test_beam_search_equals_transformers_beam_search(engine, loaded, num_beams, early_stopping):
    """Unwatermarked, the beams in the engine's block pool give transformers' own beam search, token for token."""
    for prompt in PROMPTS:
        prompt_ids = ids_of(engine, prompt)
        params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
        (ours,) = engine.decode(prompt_ids, params, DecodingParams(beam=BeamConfig(num_beams, 1.0, early_stopping)))
        with torch.inference_mode():
            out = loaded.model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                                        dtype=torch.long), max_new_tokens=NEW_TOKENS, num_beams=num_beams,
                                        do_sample=False, length_penalty=1.0, early_stopping=early_stopping,
                                        pad_token_id=next(iter(engine.eos_token_ids)))
        theirs = out[0, len(prompt_ids):].tolist()
        assert list(ours.token_ids) == theirs[:len(ours.token_ids)]
        assert len(theirs) == len(ours.token_ids) or set(theirs[len(ours.token_ids):]) <= engine.eos_token_ids


def test_four_beams_score_at_least_greedy(engine, watermark):
    wm = watermark
    params = SamplingParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=0.0)  # equal lengths
    for prompt in PROMPTS:
        prompt_ids = ids_of(engine, prompt)
        (greedy,) = engine.generate([prompt_ids], params, watermarks=[wm])
        greedy_score = rescore(engine, prompt_ids, greedy.token_ids, params, wm)
        beams = run_beam(engine, prompt_ids, params, BeamConfig(4), wm, n=4)
        assert len(beams) == 4
        scores = [b.cumulative_logprob for b in beams]
        assert scores == sorted(scores, reverse=True)
        assert scores[0] >= greedy_score - SCORE_TOLERANCE, (prompt, scores, greedy_score)
        recomputed = rescore(engine, prompt_ids, beams[0].token_ids, params, wm)
        assert abs(recomputed - scores[0]) < SCORE_TOLERANCE, (prompt, recomputed, scores[0])
        assert beams[0].decoding_stats["beam_score"] == pytest.approx(scores[0] / NEW_TOKENS)
        assert len({tuple(b.token_ids) for b in beams}) == 4


def test_length_penalty_and_early_stopping_change_the_result(engine):
    """Running beams do not depend on early_stopping, only when the search stops: True stops first, then
    False, then 'never' (exact), and each later stop keeps every finished beam the earlier one had. A
    positive length penalty favours the long answer, a negative one the short (this prompt's answers
    range from 8 tokens to the 20-token limit)."""
    prompt = engine.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    params = SamplingParams(max_new_tokens=20, temperature=0.0)

    def best(penalty, mode):
        return engine.decode(prompt, params, DecodingParams(beam=BeamConfig(3, penalty, mode)))[0]

    found = {mode: best(3.0, mode) for mode in (True, False, "never")}
    steps = [found[m].decoding_stats["steps"] for m in (True, False, "never")]
    scores = [found[m].decoding_stats["beam_score"] for m in (True, False, "never")]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert scores == sorted(scores) and scores[0] < scores[-1]
    short = best(-1.0, "never")
    assert len(short.token_ids) < len(found["never"].token_ids)


def test_beam_honours_stop_strings_and_stop_tokens(engine):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, stop=["."])
    (out,) = engine.decode(PROMPTS[0], params, DecodingParams(beam=BeamConfig(2)))
    assert out.finish_reason == "stop" and "." not in out.text
    stop_token = out.token_ids[0]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=[stop_token], min_new_tokens=0)
    for b in run_beam(engine, ids_of(engine, PROMPTS[0]), params, BeamConfig(2), n=2):
        assert stop_token not in b.token_ids[:-1]
        assert b.finish_reason == ("stop" if b.token_ids[-1] == stop_token else "length")


def test_watermarked_beam_search_is_detected_at_200_tokens(engine, watermark, tmp_path):
    from detector.service import Detector

    wm = watermark
    keyring = SimpleNamespace(path=tmp_path / "no-keyring", secret=lambda key_id: TEST_SECRET)  # what detect reads
    prompt = engine.apply_chat_template([{"role": "user", "content":
                                          "Write a short story about a lighthouse keeper who finds a message in a bottle."}])
    params = SamplingParams(max_new_tokens=200, min_new_tokens=200, temperature=0.0)
    (out,) = engine.decode(prompt, params, DecodingParams(beam=BeamConfig(2)), watermark=wm)
    assert len(out.token_ids) == 200
    verdict = Detector(keyring=keyring).detect(out.text, keys=[wm.key_id])
    assert verdict.z_score >= Z_THRESHOLD, verdict.z_score


# ---- n / best_of ----------------------------------------------------------------------------------

def test_best_of_one_is_the_engines_seeded_sample(engine, watermark):
    wm = watermark
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, top_k=50, seed=1234)
    for mark in (None, wm):
        (engine_out,) = engine.generate([PROMPTS[1]], params, watermarks=[mark])
        (ours,) = run_best_of(engine, ids_of(engine, PROMPTS[1]), params, 1, 1, mark)
        assert ours.token_ids == engine_out.token_ids and ours.text == engine_out.text


def test_best_of_is_reproducible_ranked_and_scored(engine, watermark):
    wm = watermark
    prompt_ids = ids_of(engine, PROMPTS[1])
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0, seed=99)
    every = run_best_of(engine, prompt_ids, params, 4, 4, wm)
    best_two = engine.decode(prompt_ids, params, DecodingParams(n=2, best_of=4), watermark=wm)  # a second run
    scores = [o.cumulative_logprob for o in every]
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(o.token_ids) for o in every}) == 4  # four seeds, four different samples
    assert [o.token_ids for o in best_two] == [o.token_ids for o in every[:2]]
    assert [o.decoding_stats["sibling"] for o in best_two] == [o.decoding_stats["sibling"] for o in every[:2]]
    for out in (every[0], every[-1]):
        assert abs(rescore(engine, prompt_ids, out.token_ids, params, wm) - out.cumulative_logprob) < SCORE_TOLERANCE
    assert sibling_seed(99, 0) == 99 and len({sibling_seed(99, i) for i in range(4)}) == 4


# ---- validation -------------------------------------------------------------------------------------

def test_bad_configs_and_combinations_raise(engine):
    bad = [
        (lambda: BeamConfig(0), "BeamConfig.num_beams"),
        (lambda: BeamConfig(2, early_stopping="sometimes"), "BeamConfig.early_stopping"),
        (lambda: BeamConfig(2, length_penalty=float("nan")), "BeamConfig.length_penalty"),
        (lambda: DecodingParams(n=0), "DecodingParams.n"),
        (lambda: DecodingParams(n=3, best_of=2), "DecodingParams.best_of"),
        (lambda: DecodingParams(n=3, beam=BeamConfig(2)), "DecodingParams.n"),
        (lambda: DecodingParams(best_of=2, beam=BeamConfig(2)), "DecodingParams.best_of"),
        (lambda: DecodingParams(beam=object()), "DecodingParams.beam"),
    ]
    for make, field in bad:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            make()
    sampling_only = [SamplingParams(mirostat_mode=2), SamplingParams(temperature=0.7), SamplingParams(top_p=0.9),
                     SamplingParams(logprobs=2)]
    for params in sampling_only:
        with pytest.raises(ValueError, match="with beam search"):
            check_beam_params(params)
        with pytest.raises(ValueError, match="with beam search"):
            engine.decode(PROMPTS[0], params, DecodingParams(beam=BeamConfig(2)))
    with pytest.raises(ValueError, match="temperature=0"):
        engine.decode(PROMPTS[0], SamplingParams(temperature=0.0), DecodingParams(n=2))
    with pytest.raises(TypeError, match="DecodingParams"):
        run_decoding(engine, PROMPTS[0], SamplingParams(), decoding={"n": 2})


def test_two_methods_at_once_raise():
    mbr = pytest.importorskip("generation.decoding.mbr")
    with pytest.raises(ValueError, match="only one decoding method"):
        DecodingParams(beam=BeamConfig(2), mbr=mbr.MBRConfig(num_candidates=4))
    with pytest.raises(ValueError, match="DecodingParams.n"):
        DecodingParams(n=2, mbr=mbr.MBRConfig(num_candidates=4))
