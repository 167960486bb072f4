"""Sampler suite: each transform against transformers' reference processors row by row, penalties
against the OpenAI formula, mirostat's mu update, seeded independence from batch-mates, and sampled
frequencies against the target distribution (chi-square bound at a fixed alpha)."""

import math
from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chi2
from transformers.generation import logits_process as lp

from generation.sample import LogitsPipeline, SampleOutput, StepRows
from generation.sample.sampler import (
    SamplerState,
    SamplingParams,
    apply_bans_,
    apply_penalties_,
    mirostat_,
    mirostat_v1_k,
    truncate_,
)
from generation.sample.stage import WatermarkStage

ALPHA = 1e-3  # false-failure rate of each chi-square test (fixed seeds make it deterministic anyway)


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def assert_rows_match(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """Same -inf set; finite values equal."""
    assert torch.equal(torch.isinf(ours), torch.isinf(reference))
    finite = torch.isfinite(reference)
    torch.testing.assert_close(ours[finite], reference[finite], rtol=1e-6, atol=1e-6)


def check_truncation(params: list[SamplingParams], warpers: list[list], logits: torch.Tensor) -> None:
    ours = logits.clone()
    truncate_(ours, params)
    ids = torch.zeros(1, 1, dtype=torch.long)
    for row, chain in enumerate(warpers):
        expected = logits[row:row + 1].clone()
        for warper in chain:
            expected = warper(ids, expected)
        assert_rows_match(ours[row:row + 1], expected)


# ---- validation ----

@pytest.mark.parametrize("field, value", [
    ("max_new_tokens", 0), ("min_new_tokens", -1), ("temperature", -0.5), ("top_k", -1), ("top_p", 0.0),
    ("top_p", 1.5), ("min_p", 1.1), ("typical_p", 0.0), ("epsilon_cutoff", 1.0), ("eta_cutoff", -0.1),
    ("mirostat_mode", 3), ("mirostat_tau", 0.0), ("mirostat_eta", 0.0), ("repetition_penalty", 0.0),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("logit_bias", {"a": 1.0}),
    ("no_repeat_ngram_size", -2), ("bad_words_ids", [[]]), ("stop", [""]), ("stop_token_ids", ["x"]),
    ("seed", -1), ("logprobs", -1), ("temperature", float("nan")), ("top_k", 2.0),
])
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}\b"):
        SamplingParams(**{field: value})


def test_min_new_tokens_cannot_exceed_max():
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {100: 1.0}), ("bad_words_ids", [[1, 100]]), ("stop_token_ids", [-1]),
])
def test_validate_for_vocab_names_the_field(field, value):
    params = SamplingParams(**{field: value})
    with pytest.raises(ValueError, match=field):
        params.validate_for_vocab(100)
    SamplingParams().validate_for_vocab(100)


def test_greedy_property():
    assert SamplingParams(temperature=0).greedy and not SamplingParams(temperature=0.1).greedy


# ---- truncation against transformers, several rows with different parameters in one batch ----

def test_top_k_rows_match_reference():
    ks = [0, 1, 5, 50, 499, 600]
    params = [SamplingParams(top_k=k) for k in ks]
    warpers = [[lp.TopKLogitsWarper(k)] if k else [] for k in ks]
    check_truncation(params, warpers, random_logits(len(ks), 500, seed=1))


@pytest.mark.parametrize("scale", [0.5, 3.0, 12.0])  # flat rows need the full sort, peaked ones fit the prefix
def test_top_p_rows_match_reference(scale):
    ps = [1.0, 0.1, 0.5, 0.9, 0.99, 1.0]
    params = [SamplingParams(top_p=p) for p in ps]
    warpers = [[lp.TopPLogitsWarper(p)] if p < 1 else [] for p in ps]
    check_truncation(params, warpers, random_logits(len(ps), 2000, seed=2, scale=scale))


def test_min_p_rows_match_reference():
    ps = [0.0, 0.01, 0.1, 0.5, 1.0]
    params = [SamplingParams(min_p=p) for p in ps]
    warpers = [[lp.MinPLogitsWarper(p)] if p > 0 else [] for p in ps]
    check_truncation(params, warpers, random_logits(len(ps), 700, seed=3))


@pytest.mark.parametrize("scale", [0.3, 2.0, 8.0])
def test_typical_rows_match_reference(scale):
    ps = [1.0, 0.2, 0.5, 0.9, 0.95]
    params = [SamplingParams(typical_p=p) for p in ps]
    warpers = [[lp.TypicalLogitsWarper(p)] if p < 1 else [] for p in ps]
    check_truncation(params, warpers, random_logits(len(ps), 1000, seed=4, scale=scale))


def test_epsilon_and_eta_rows_match_reference():
    eps = [0.0, 1e-4, 3e-3, 0.2]
    logits = random_logits(len(eps), 800, seed=5)
    check_truncation([SamplingParams(epsilon_cutoff=e) for e in eps],
                     [[lp.EpsilonLogitsWarper(e)] if e else [] for e in eps], logits)
    check_truncation([SamplingParams(eta_cutoff=e) for e in eps],
                     [[lp.EtaLogitsWarper(e)] if e else [] for e in eps], logits)


def test_truncation_chain_matches_reference_chain():
    """All truncations at once share one sort; the result equals the warpers applied in order."""
    configs = [
        dict(top_k=200, top_p=0.9, min_p=0.02, typical_p=0.9, epsilon_cutoff=1e-4, eta_cutoff=1e-3),
        dict(top_p=0.95, typical_p=0.7),
        dict(top_k=40, min_p=0.05),
        dict(),
        dict(top_p=0.8, eta_cutoff=3e-4),
    ]

    def chain(c):
        w = []
        if c.get("top_k"):
            w.append(lp.TopKLogitsWarper(c["top_k"]))
        if c.get("top_p"):
            w.append(lp.TopPLogitsWarper(c["top_p"]))
        if c.get("min_p"):
            w.append(lp.MinPLogitsWarper(c["min_p"]))
        if c.get("typical_p"):
            w.append(lp.TypicalLogitsWarper(c["typical_p"]))
        if c.get("epsilon_cutoff"):
            w.append(lp.EpsilonLogitsWarper(c["epsilon_cutoff"]))
        if c.get("eta_cutoff"):
            w.append(lp.EtaLogitsWarper(c["eta_cutoff"]))
        return w

    for scale in (0.7, 2.5):
        check_truncation([SamplingParams(**c) for c in configs], [chain(c) for c in configs],
                         random_logits(len(configs), 3000, seed=6, scale=scale))


def test_rows_with_a_transform_off_are_untouched_bit_for_bit():
    logits = random_logits(3, 1000, seed=7)
    logits[:, 500:] = -200.0  # probabilities underflow to 0, yet an off row must keep them finite
    ours = logits.clone()
    truncate_(ours, [SamplingParams(), SamplingParams(top_p=0.5, typical_p=0.5, min_p=0.1), SamplingParams()])
    assert torch.equal(ours[0], logits[0]) and torch.equal(ours[2], logits[2])
    assert torch.isinf(ours[1]).any()


# ---- penalties, bias and bans ----

def states_for(params: list[SamplingParams], prompts: list[list[int]], generated: list[list[int]], eos=frozenset({0})):
    states = [SamplerState(p, prompt, set(eos)) for p, prompt in zip(params, prompts)]
    for st, gen in zip(states, generated):
        for t in gen:
            st.append(t)
    return states


PROMPTS = [[3, 4, 5, 3], [7, 8], [1, 2, 3, 1, 2], [9, 9, 9]]
GENERATED = [[5, 6, 5, 7], [8, 8, 9], [3, 1], []]


def test_repetition_penalty_matches_reference():
    penalties = [1.0, 1.2, 0.8, 2.0]
    logits = random_logits(4, 50, seed=8)
    ours = logits.clone()
    apply_penalties_(ours, states_for([SamplingParams(repetition_penalty=p) for p in penalties], PROMPTS, GENERATED))
    for row, pen in enumerate(penalties):
        ids = torch.tensor([PROMPTS[row] + GENERATED[row]])
        expected = lp.RepetitionPenaltyLogitsProcessor(pen)(ids, logits[row:row + 1].clone())
        assert_rows_match(ours[row:row + 1], expected)


def test_presence_and_frequency_follow_openai_formula():
    configs = [(0.0, 0.0), (0.5, 0.0), (0.0, 0.7), (1.5, -0.4)]
    logits = random_logits(4, 50, seed=9)
    ours = logits.clone()
    params = [SamplingParams(presence_penalty=a, frequency_penalty=f) for a, f in configs]
    apply_penalties_(ours, states_for(params, PROMPTS, GENERATED))
    for row, (presence, frequency) in enumerate(configs):
        expected = logits[row].clone()
        for token in set(GENERATED[row]):  # OpenAI: over generated tokens only, prompt excluded
            count = GENERATED[row].count(token)
            expected[token] -= count * frequency + presence
        torch.testing.assert_close(ours[row], expected)


def test_logit_bias_matches_sequence_bias_reference():
    biases = [None, {4: 3.0, 10: -5.0}, {0: -100.0}, {49: 1.5}]
    logits = random_logits(4, 50, seed=10)
    ours = logits.clone()
    apply_penalties_(ours, states_for([SamplingParams(logit_bias=b) for b in biases], PROMPTS, GENERATED))
    for row, bias in enumerate(biases):
        expected = logits[row:row + 1].clone()
        if bias:
            processor = lp.SequenceBiasLogitsProcessor({(t,): float(v) for t, v in bias.items()})
            expected = processor(torch.tensor([PROMPTS[row] + GENERATED[row]]), expected)
        assert_rows_match(ours[row:row + 1], expected)


def test_no_repeat_ngram_matches_reference():
    sizes = [0, 1, 2, 3]
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4], [1, 2, 1, 3, 1], [6, 7, 8, 6, 7]]
    generated = [[3, 1], [5], [2, 4, 1], [9, 6, 7]]
    logits = random_logits(4, 20, seed=11)
    ours = logits.clone()
    apply_bans_(ours, states_for([SamplingParams(no_repeat_ngram_size=n) for n in sizes], prompts, generated))
    for row, n in enumerate(sizes):
        expected = logits[row:row + 1].clone()
        if n:
            expected = lp.NoRepeatNGramLogitsProcessor(n)(torch.tensor([prompts[row] + generated[row]]), expected)
        assert_rows_match(ours[row:row + 1], expected)
    assert torch.isinf(ours[1:]).any(dim=1).all()  # the case is not vacuous


def test_bad_words_match_reference():
    words = [None, [[4], [1, 2, 7]], [[3, 1, 9], [5, 6]], [[8], [6, 7, 11]]]
    logits = random_logits(4, 20, seed=12)
    ours = logits.clone()
    apply_bans_(ours, states_for([SamplingParams(bad_words_ids=w) for w in words], PROMPTS, GENERATED))
    for row, bad in enumerate(words):
        expected = logits[row:row + 1].clone()
        if bad:
            expected = lp.NoBadWordsLogitsProcessor(bad)(torch.tensor([PROMPTS[row] + GENERATED[row]]), expected)
        assert_rows_match(ours[row:row + 1], expected)


def test_min_new_tokens_matches_reference_and_covers_stop_ids():
    params = [SamplingParams(min_new_tokens=m, stop_token_ids=s) for m, s in [(0, None), (5, [12]), (3, None), (2, [13])]]
    eos = {0, 19}
    logits = random_logits(4, 20, seed=13)
    ours = logits.clone()
    states = states_for(params, PROMPTS, GENERATED, eos=eos)
    apply_bans_(ours, states)
    for row, (p, st) in enumerate(zip(params, states)):
        banned = sorted(eos | set(p.stop_token_ids or ()))
        processor = lp.MinNewTokensLengthLogitsProcessor(len(PROMPTS[row]), p.min_new_tokens, banned)
        expected = processor(torch.tensor([st.history]), logits[row:row + 1].clone())
        assert_rows_match(ours[row:row + 1], expected)
    assert torch.isinf(ours[1, [0, 12, 19]]).all() and not torch.isinf(ours[0]).any()


# ---- sampling ----

def run(sampler: LogitsPipeline, logits_for_step, params: list[SamplingParams], steps: int) -> list[list[int]]:
    states = [SamplerState(p, [1, 2, 3], {0}) for p in params]
    out = [[] for _ in params]
    for step in range(steps):
        result = sampler.sample(logits_for_step(step, len(params)), StepRows.of(states))
        for st, seq, token in zip(states, out, result.token_ids.tolist()):
            st.append(token)
            seq.append(token)
    return out


def test_seeded_row_is_independent_of_its_batch_mates():
    vocab = 3000
    target = SamplingParams(seed=1234, top_p=0.9, temperature=0.8)

    def logits_for_step(step, rows):  # each row drawn alone: row 0 sees the same logits in both runs
        return torch.cat([random_logits(1, vocab, seed=1000 * r + step, scale=2.0) for r in range(rows)])

    alone = run(LogitsPipeline(vocab, "cpu"), logits_for_step, [target], 50)[0]
    mates = [SamplingParams(temperature=0), SamplingParams(seed=1, top_k=20, typical_p=0.8),
             SamplingParams(seed=2, mirostat_mode=2), SamplingParams(min_p=0.1, repetition_penalty=1.3, logprobs=2)]
    together = run(LogitsPipeline(vocab, "cpu"), logits_for_step, [target] + mates, 50)[0]
    assert alone == together
    other_seed = run(LogitsPipeline(vocab, "cpu"), logits_for_step, [SamplingParams(seed=99, top_p=0.9, temperature=0.8)], 50)[0]
    assert other_seed != alone


def test_greedy_rows_take_argmax_and_consume_no_randomness():
    logits = random_logits(2, 100, seed=14)
    states = [SamplerState(SamplingParams(temperature=0, top_k=3, seed=5), [1], {0}),
              SamplerState(SamplingParams(seed=6), [1], {0})]
    before = [st.generator.get_state().clone() for st in states]
    out = LogitsPipeline(100, "cpu").sample(logits, StepRows.of(states))
    assert out.token_ids[0] == logits[0].argmax()
    assert torch.equal(states[0].generator.get_state(), before[0])
    assert not torch.equal(states[1].generator.get_state(), before[1])


def test_input_logits_are_not_modified():
    logits = random_logits(2, 100, seed=15)
    copy = logits.clone()
    states = [SamplerState(SamplingParams(top_p=0.5, repetition_penalty=1.5, seed=1), [1, 2], {0}),
              SamplerState(SamplingParams(temperature=0.5, min_p=0.2, seed=2), [3], {0})]
    LogitsPipeline(100, "cpu").sample(logits, StepRows.of(states))
    assert torch.equal(logits, copy)


def chi_square_check(counts: torch.Tensor, probs: torch.Tensor) -> None:
    draws = int(counts.sum())
    live = probs > 0
    assert counts[~live].sum() == 0, "a truncated token was sampled"
    expected = probs[live].double() * draws
    statistic = float(((counts[live].double() - expected) ** 2 / expected).sum())
    assert statistic < chi2.ppf(1 - ALPHA, int(live.sum()) - 1)


@pytest.mark.parametrize("config", [dict(), dict(temperature=0.5, top_k=5)])
def test_sampled_frequencies_match_the_distribution(config):
    base = torch.log(torch.tensor([0.3, 0.2, 0.15, 0.1, 0.08, 0.07, 0.05, 0.05]))
    expected = base[None].clone()
    if config:
        expected = lp.TopKLogitsWarper(config["top_k"])(None, lp.TemperatureLogitsWarper(config["temperature"])(None, expected))
    probs = expected.softmax(-1)[0]
    rows, steps = 200, 60  # 12,000 draws; seeded rows, fixed logits
    params = [SamplingParams(seed=10_000 + r, **config) for r in range(rows)]
    tokens = run(LogitsPipeline(8, "cpu"), lambda step, n: base.expand(n, -1).clone(), params, steps)
    counts = torch.bincount(torch.tensor(tokens).flatten(), minlength=8)
    chi_square_check(counts, probs)


class BoostStage(WatermarkStage):
    """A watermark stage that transforms: token 5 up by 100 on the rows it serves."""

    chooses_tokens = False

    def transform_(self, scores, contexts, marks, code=None):
        for row, mark in enumerate(marks):
            if mark is not None:
                scores[row, 5] += 100.0


def _marks_with(stage, rows: int) -> list:
    """Watermark stand-ins that name ``stage`` as their pipeline stage."""
    mark = SimpleNamespace(pipeline_stage=stage, context_width=1, spec=SimpleNamespace(hard=False))
    return [mark] * rows


class LastLiveTokenStage(WatermarkStage):
    """A sampler stage (as Gumbel-max or a SynthID tournament would be): it picks the highest live token id."""

    chooses_tokens = True

    def __init__(self):
        self.seen = []

    def choose(self, probs, contexts, marks, generators, candidates=None):
        self.seen.append((probs.clone(), list(contexts)))
        live = probs > 0
        return (live * torch.arange(probs.shape[1])).argmax(-1)


def test_a_choosing_stage_replaces_the_draw_for_its_rows_only():
    vocab = 64
    logits = random_logits(3, vocab, seed=21)
    params = [SamplingParams(seed=1, top_k=5), SamplingParams(seed=2, top_p=0.8), SamplingParams(seed=3, temperature=0)]
    plain_states = [SamplerState(p, [1, 2], {0}) for p in params]
    plain = LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of(plain_states))
    stage = LastLiveTokenStage()
    states = [SamplerState(p, [1, 2], {0}) for p in params]
    marks = _marks_with(stage, 3)
    marks[1] = None  # row 1 unwatermarked: the ordinary draw
    staged = LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of(states, marks))
    kept = logits[0] >= logits[0].topk(5).values[-1]  # row 0's top-k survivors
    assert staged.token_ids[0] == int(kept.nonzero().max())
    assert staged.token_ids[1] == plain.token_ids[1]  # untouched by the stage
    assert staged.token_ids[2] == plain.token_ids[2] == logits[2].argmax()  # greedy rows take argmax
    assert len(stage.seen) == 1 and stage.seen[0][0].shape == (1, vocab)  # only the sampled staged row
    assert stage.seen[0][1] == [[2]]  # its context: the last context_width tokens
    assert torch.equal(states[0].generator.get_state(), SamplerState(params[0], [1], {0}).generator.get_state())


def test_logprobs_are_taken_before_the_watermark_stage():
    vocab = 64
    logits = random_logits(2, vocab, seed=16)
    params = [SamplingParams(temperature=0, logprobs=3), SamplingParams(seed=3, logprobs=0)]

    plain = LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of([SamplerState(p, [1], {0}) for p in params]))
    states = [SamplerState(p, [1], {0}) for p in params]
    hooked = LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of(states, _marks_with(BoostStage(), 2)))
    assert isinstance(hooked, SampleOutput)
    assert hooked.token_ids.tolist() == [5, 5]  # the hook was applied to sampling
    reference = logits.log_softmax(-1)
    torch.testing.assert_close(hooked.logprobs, reference[:, 5])
    assert hooked.top_logprobs[0] == plain.top_logprobs[0]
    assert [t for t, _ in hooked.top_logprobs[0]] == reference[0].topk(3).indices.tolist()
    assert hooked.top_logprobs[1] == []


# ---- mirostat ----

def test_mirostat_v2_truncates_by_surprise_and_updates_mu():
    vocab, tau, eta = 200, 3.0, 0.1
    logits = random_logits(1, vocab, seed=17, scale=2.0)
    state = SamplerState(SamplingParams(mirostat_mode=2, mirostat_tau=tau, mirostat_eta=eta, temperature=0.9, seed=8), [1], {0})
    assert state.mirostat_mu == 2 * tau
    scaled = logits / 0.9
    truncated = scaled.clone()
    mirostat_(truncated, [2], torch.tensor([[state.mirostat_mu]]))
    surprise_bits = -scaled.log_softmax(-1)[0] / math.log(2)
    assert torch.equal(torch.isfinite(truncated[0]), surprise_bits <= 2 * tau)
    token = int(LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of([state])).token_ids[0])
    assert surprise_bits[token] <= 2 * tau
    state.append(token)
    assert state.mirostat_mu == pytest.approx(2 * tau - eta * (float(surprise_bits[token]) - tau), rel=1e-6)


def test_mirostat_mu_moves_only_for_the_sampled_token():
    state = SamplerState(SamplingParams(mirostat_mode=2, seed=1), [1], {0})
    state.pending_surprise = (7, 9.0)
    state.append(8)  # the engine accepted another token (e.g. a speculative one): no update
    assert state.mirostat_mu == 10.0 and state.pending_surprise is None


def test_mirostat_v1_k_recovers_zipf_exponent():
    """On an exact Zipf law p_i ~ i^-s, the estimate s_hat equals s, so k follows the closed form."""
    vocab, s, mu = 5000, 1.3, 6.0
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    logp = (-s * ranks.log()).log_softmax(-1).float()[None]
    k = int(mirostat_v1_k(logp, torch.tensor([mu]), vocab)[0])
    e = s - 1
    assert k == round((e * 2 ** mu / (1 - vocab ** -e)) ** (1 / s))
    truncated = logp.clone()
    mirostat_(truncated, [1], torch.tensor([[mu]]))
    assert int(torch.isfinite(truncated).sum()) == k


def test_mirostat_v1_updates_mu_from_untruncated_surprise():
    vocab = 500
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    logits = (-1.1 * ranks.log())[None]
    state = SamplerState(SamplingParams(mirostat_mode=1, mirostat_tau=4.0, mirostat_eta=0.2, seed=3), [1], {0})
    token = int(LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of([state])).token_ids[0])
    surprise = float(-logits.log_softmax(-1)[0, token] / math.log(2))
    state.append(token)
    assert state.mirostat_mu == pytest.approx(8.0 - 0.2 * (surprise - 4.0), rel=1e-6)


def test_top_p_sorts_everything_when_the_head_bound_falls_short():
    from generation.sample.sampler import DescendingOrder, top_p_
    logits = random_logits(3, 1500, seed=18, scale=1.0)
    ps = [0.3, 0.8, 0.95]
    ours = logits.clone()
    short = DescendingOrder(ours, size=2)  # far too few tokens for these p
    top_p_(ours, torch.tensor(ps)[:, None], short)
    assert short.full
    for row, p in enumerate(ps):
        assert_rows_match(ours[row:row + 1], lp.TopPLogitsWarper(p)(None, logits[row:row + 1].clone()))


@pytest.mark.parametrize("params", [
    SamplingParams(repetition_penalty=1e-40, top_p=0.5, seed=3),  # seen positive logits / 1e-40 -> +inf
    SamplingParams(temperature=1e-40, top_p=0.9, seed=3),  # every positive logit / 1e-40 -> +inf
    SamplingParams(temperature=1e-40, top_k=5, seed=3),  # the top-k head path
])
def test_logits_pushed_past_the_float_range_still_sample(params):
    # found by the OpenAPI fuzzer: one +inf made the row's log-softmax NaN and the top-p histogram index
    # garbage (a 500). The overflowed tokens now share the row's mass, the limit the request asks for.
    vocab = 50
    logits = torch.full((1, vocab), -1.0)
    logits[0, [7, 11]] = 2.0  # the two largest logits, both seen in the prompt
    state = SamplerState(params, [7, 11, 3], {0})
    token = LogitsPipeline(vocab, "cpu").sample(logits, StepRows.of([state])).token_ids.item()
    assert token in (7, 11)
