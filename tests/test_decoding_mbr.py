"""generation.decoding.mbr and .similarity: chrF / token F1 values worked by hand, the consensus choice on
crafted candidate sets, config validation, and MBR on the embedded model (reproducible, watermarked)."""

from __future__ import annotations

import dataclasses
import importlib.metadata

import pytest

from generation.decoding.mbr import MBRConfig, candidate_seed, run_mbr, select_consensus
from generation.decoding.similarity import (
    chrf,
    make_similarity,
    mean_similarities,
    token_f1,
)
from generation.sample.sampler import SamplingParams
from generation.sequence import RequestOutput, Usage

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

Z_THRESHOLD = 4.0  # the detector's threshold: watermarked outputs detected at z >= 4 (one-sided p ~ 3.2e-5)
WATERMARK_TOKENS = 200  # ... at 200 tokens


# ------------------------------------------------------------------------------ similarities
def test_chrf_matches_a_hand_computed_value():
    # "ab" vs "abcd": unigrams P=2/2 R=2/4, bigrams P=1/1 R=1/3; orders 3..6 unreached by "ab" are skipped.
    # P = 1, R = (1/2 + 1/3) / 2 = 5/12; chrF2 = 5 P R / (4 P + R) = (25/12) / (53/12) = 25/53
    assert chrf("ab", "abcd") == pytest.approx(25 / 53)
    assert chrf("abcd", "ab") == pytest.approx(5 * (5 / 12) / (4 * 5 / 12 + 1))  # roles swapped: recall 1
    assert chrf("the cat", "thecat") == 1.0  # whitespace is ignored, as sacrebleu's chrF
    assert chrf("abc", "xyz") == 0.0
    assert chrf("", "") == 1.0 and chrf("", "abc") == 0.0 and chrf("abc", "") == 0.0


def test_token_f1_matches_hand_computed_values():
    assert token_f1("a b", "a c") == pytest.approx(0.5)
    assert token_f1("The the cat", "the cat sat") == pytest.approx(2 * 2 / 6)  # clipped: one "the" matches
    assert token_f1("", "") == 1.0 and token_f1("", "x") == 0.0


def test_chrf_survives_word_form_changes_that_token_f1_does_not():
    assert token_f1("raining", "rains") == 0.0
    # orders 1..5 (6 is unreached by "rains"): overlaps 4, 3, 2, 1, 0 of 7, 6, 5, 4, 3 and 5, 4, 3, 2, 1 n-grams
    precision = (4 / 7 + 3 / 6 + 2 / 5 + 1 / 4 + 0) / 5
    recall = (4 / 5 + 3 / 4 + 2 / 3 + 1 / 2 + 0) / 5
    assert chrf("raining", "rains") == pytest.approx(5 * precision * recall / (4 * precision + recall))


@pytest.mark.parametrize("similarity", ["chrf", "token_f1"])
def test_consensus_picks_the_centre_of_a_crafted_set(similarity):
    texts = [
        "quantum chromodynamics binds quarks",  # the outlier
        "the quick brown fox jumps high",  # the centre: one word from each variant, which are two apart
        "one quick brown fox jumps high",
        "the slow brown fox jumps high",
        "the quick brown cat jumps high",
    ]
    best, means = select_consensus(texts, make_similarity(similarity))
    assert best == 1
    assert min(range(len(texts)), key=means.__getitem__) == 0
    assert means == pytest.approx(mean_similarities(texts, make_similarity(similarity)))


def test_duplicates_win_and_ties_go_to_the_first():
    best, means = select_consensus(["x y z", "a b c", "a b c"], make_similarity("token_f1"))
    assert best == 1 and means == pytest.approx([0.0, 0.5, 0.5])
    best, _ = select_consensus(["a b", "c d"], make_similarity("chrf"))
    assert best == 0
    assert select_consensus(["alone"], make_similarity("chrf")) == (0, [0.0])


def test_mean_is_over_the_others_as_references():
    texts = ["ab", "abcd", "abcd"]
    means = mean_similarities(texts, make_similarity("chrf"))
    assert means[0] == pytest.approx(25 / 53)  # "ab" against both "abcd"
    assert means[1] == pytest.approx((chrf("abcd", "ab") + 1.0) / 2)


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize("kwargs, field", [
    ({"num_candidates": 1}, "num_candidates"),
    ({"num_candidates": 0}, "num_candidates"),
    ({"num_candidates": 10_000}, "num_candidates"),
    ({"num_candidates": True}, "num_candidates"),
    ({"num_candidates": 4.0}, "num_candidates"),
    ({"similarity": "bleu"}, "similarity"),
    ({"chrf_order": 0}, "chrf_order"),
    ({"chrf_beta": 0.0}, "chrf_beta"),
    ({"chrf_beta": float("nan")}, "chrf_beta"),
])
def test_bad_configs_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"MBRConfig\.{field}="):
        MBRConfig(**kwargs)


def test_candidate_seeds_are_stable_and_distinct():
    seeds = [candidate_seed(7, i) for i in range(64)]
    assert len(set(seeds)) == 64 and all(0 <= s < 2**63 for s in seeds)
    assert seeds == [candidate_seed(7, i) for i in range(64)]
    assert candidate_seed(8, 0) not in seeds


class ScriptedEngine:
    """Stands in for Engine.generate: returns the given texts as candidates and records what it was asked."""

    def __init__(self, texts, reasons=None):
        self.texts, self.reasons, self.calls = texts, reasons or ["stop"] * len(texts), []

    def generate(self, prompts, params, watermarks, use_tqdm=None):
        self.calls.append((prompts, params, watermarks))
        return [RequestOutput(f"req-{i}", list(prompts[i]), [1] * (i + 1), text, text, True, reason, Usage(len(prompts[i]), i + 1))
                for i, (text, reason) in enumerate(zip(self.texts, self.reasons))]


def test_run_mbr_passes_derived_seeds_and_the_watermark_to_every_candidate():
    engine = ScriptedEngine(["x y z", "a b c", "a b c d"])
    mark = object()
    (out,) = run_mbr(engine, [5, 6], SamplingParams(temperature=0.7, seed=9), MBRConfig(num_candidates=3, similarity="token_f1"),
                     watermark=mark)
    ((prompts, params, marks),) = engine.calls
    assert prompts == [[5, 6]] * 3 and marks == [mark] * 3
    assert [p.seed for p in params] == [candidate_seed(9, i) for i in range(3)]
    assert all(p.temperature == 0.7 for p in params)
    assert out.request_id == "req-1" and out.decoding_stats["chosen"] == 1
    assert out.decoding_stats["candidate_tokens"] == 1 + 2 + 3 and out.usage.completion_tokens == 2


def test_candidates_that_failed_their_constraint_take_no_part():
    engine = ScriptedEngine(["a b c", "a b c", "x y"], reasons=["error", "error", "stop"])
    (out,) = run_mbr(engine, [5], SamplingParams(temperature=1.0), MBRConfig(num_candidates=3, similarity="token_f1"))
    assert out.decoding_stats["chosen"] == 2 and out.decoding_stats["mean_similarities"] == [None, None, 0.0]


# ------------------------------------------------------------------------------ the embedded model
@pytest.fixture(scope="module")
def engine(loaded):
    from generation.engine import Engine

    return Engine(loaded, max_num_seqs=8, max_model_len=512)


def _news_prompt(engine) -> list[int]:
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    with open(path, encoding="utf-8") as lines:
        article = next(line.strip() for line in lines if line.strip())
    first_sentence = article.split(". ")[0].strip() + "."
    return engine.apply_chat_template([{"role": "user", "content": f"Continue this news story: {first_sentence}"}])


@pytest.mark.slow
def test_greedy_params_make_no_sense(engine):
    with pytest.raises(ValueError, match="temperature=0"):
        run_mbr(engine, [1, 2, 3], SamplingParams(max_new_tokens=4, temperature=0.0), MBRConfig())


@pytest.mark.slow
def test_seeded_mbr_is_reproducible_and_returns_one_of_its_samples(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": "Name a colour and say why you like it."}])
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=11)
    config = MBRConfig(num_candidates=3)
    (first,) = run_mbr(engine, prompt, params, config)
    (second,) = run_mbr(engine, prompt, params, config)
    assert first.token_ids == second.token_ids and first.decoding_stats == second.decoding_stats
    stats = first.decoding_stats
    assert stats["method"] == "mbr" and stats["num_candidates"] == 3 and len(stats["mean_similarities"]) == 3
    assert stats["mean_similarities"][stats["chosen"]] == max(stats["mean_similarities"])
    # the chosen output is exactly the plain sample its derived seed gives
    alone = dataclasses.replace(params, seed=candidate_seed(11, stats["chosen"]))
    (plain,) = engine.generate([prompt], alone)
    assert first.token_ids == plain.token_ids and first.text == plain.text
    assert first.usage.completion_tokens == len(first.token_ids) and first.finished


@pytest.mark.slow
def test_watermarked_mbr_output_is_detected(engine, fixed_key, loaded):
    """Two candidates (the fewest MBR takes): 200 decoding steps dominate this file's runtime."""
    from detector.service import Detector
    from watermark.scheme import generation_watermark

    wm = generation_watermark(None, engine.vocab_size)  # fixed_key: this test's own keyring
    params = SamplingParams(max_new_tokens=WATERMARK_TOKENS, min_new_tokens=WATERMARK_TOKENS, temperature=1.0, seed=5)
    (out,) = run_mbr(engine, _news_prompt(engine), params, MBRConfig(num_candidates=2), watermark=wm)
    assert len(out.token_ids) == WATERMARK_TOKENS
    assert out.watermark is not None and out.watermark.key_id == wm.key_id
    verdict = Detector(vocab=loaded.vocab).detect(out.text, keys=[wm.key_id])
    assert verdict.watermarked and verdict.z_score >= Z_THRESHOLD, verdict.z_score
