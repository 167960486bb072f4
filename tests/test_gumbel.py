"""gumbel: specs: the keyed race (one definition of r for generation and detection), its
distribution over keys, the greedy policy, and detection of simulated watermarked text."""

import hashlib

import numpy as np
import pytest
import torch
from scipy import stats

from detector.scoring_sampling import best_window, score_keys, score_text
from watermark.gumbel import GumbelWatermark, gumbel_argmax
from watermark.keyed_words import fmix64, fmix64_reference, uniform_parts
from watermark.prf import to_signed64
from watermark.sampling_common import SamplingWatermarkError, SeenContexts, require_sampling

V = 49152
KEY = hashlib.sha256(b"provmark-test/gumbel").digest()


def test_fmix64_tensor_equals_reference():
    values = [0, 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF, 12345]
    got = fmix64(torch.tensor([to_signed64(v) for v in values], dtype=torch.int64)).tolist()
    assert got == [to_signed64(fmix64_reference(v)) for v in values]


def test_r_and_one_minus_r_are_exact_and_inside_the_open_interval():
    words = torch.tensor([0, -1, to_signed64(2**63), 1 << 12], dtype=torch.int64)
    r, one_minus = uniform_parts(words)
    assert torch.all((r > 0) & (r < 1) & (one_minus > 0))
    assert torch.equal(r + one_minus, torch.ones_like(r))  # both are multiples of 2**-53 below 1


def test_whole_vocabulary_and_single_token_r_are_the_same_values():
    wm = GumbelWatermark("gumbel:h=3", KEY, V)
    gen = torch.Generator().manual_seed(1)
    contexts = torch.randint(0, V, (5, 3), generator=gen)
    tokens = torch.randint(0, V, (5, 1), generator=gen)
    full = wm.one_minus_r(contexts)
    assert torch.equal(full.gather(1, tokens), wm.one_minus_r(contexts, tokens))
    ids = torch.cat([contexts[0], tokens[0]])
    scores, units = wm.scored_positions(ids)
    assert torch.equal(units, ids.unsqueeze(0))
    assert scores[0].item() == pytest.approx(-np.log(full[0, tokens[0, 0]].item()), rel=1e-15)


def test_choice_is_argmax_of_log_r_over_p_and_never_a_truncated_token():
    wm = GumbelWatermark("gumbel:h=2", KEY, V)
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(8, V, generator=gen) * 3
    logits[:, ::2] = float("-inf")  # truncation by an earlier stage
    contexts = torch.randint(0, V, (8, 2), generator=gen)
    chosen = wm.choose(logits, contexts)
    one_minus = wm.one_minus_r(contexts)
    p = torch.softmax(logits.double(), dim=-1)
    direct = torch.argmax(torch.log1p(-one_minus) / p, dim=-1)  # log(r) / p, -inf where p = 0
    assert torch.equal(chosen, direct)
    assert torch.all(chosen % 2 == 1)


def test_over_contexts_the_race_samples_the_distribution_itself():
    """Gumbel-max: P(token v) = p_v. Each fresh context gives fresh r; counts per token must fall inside
    the two-sided binomial interval of probability 1 - 1e-6 / V (Bonferroni over the V tokens)."""
    small = 6
    wm = GumbelWatermark("gumbel:h=1", KEY, small)
    logits = torch.log(torch.tensor([[0.4, 0.25, 0.15, 0.1, 0.07, 0.03]]))
    n = 6000
    contexts = torch.arange(n).reshape(n, 1)
    chosen = gumbel_argmax(logits.expand(n, -1), wm.one_minus_r(contexts))
    counts = torch.bincount(chosen, minlength=small).numpy()
    p = torch.softmax(logits[0].double(), 0).numpy()
    low, high = stats.binom.interval(1 - 1e-6 / small, n, p)
    assert np.all((counts >= low) & (counts <= high)), (counts, low, high)


def test_greedy_requests_fail_closed():
    for temperature in (0, 0.0, None):
        with pytest.raises(SamplingWatermarkError, match="greedy"):
            require_sampling(temperature, "gumbel")
    require_sampling(0.7, "gumbel")


def test_seen_contexts_is_true_only_the_first_time():
    seen = SeenContexts()
    assert seen.first_time((1, 2)) and not seen.first_time((1, 2)) and seen.first_time((2, 1))


def simulate(wm, length, seed, vocab=V, top=8, dedup=True):
    """Generation with a peaked random distribution (mass on ``top`` random tokens per step, the
    rest truncated), the Gumbel stage choosing the token; repeated contexts sampled unwatermarked."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (wm.context_width,), generator=gen).tolist()
    seen = SeenContexts()
    for _ in range(length):
        logits = torch.full((1, vocab), float("-inf"))
        support = torch.randint(0, vocab, (top,), generator=gen)
        logits[0, support] = torch.randn(top, generator=gen) * 1.5
        context = tuple(ids[-wm.context_width:])
        if not dedup or seen.first_time(context):
            ids.append(int(wm.choose(logits, torch.tensor([context]))[0]))
        else:
            ids.append(int(torch.multinomial(torch.softmax(logits[0], 0), 1, generator=gen)))
    return ids


def test_simulated_watermarked_text_is_detected_and_other_keys_are_not_fooled():
    wm = GumbelWatermark("gumbel:h=4", KEY, V, key_id="right")
    other = GumbelWatermark("gumbel:h=4", hashlib.sha256(b"other").digest(), V, key_id="other")
    ids = simulate(wm, 200, seed=3)
    score = score_text(wm, ids)
    assert score.p_value < 1e-5 and score.z_score > 4
    best, scores = score_keys([other, wm], ids)
    assert best.key_id == "right" and best.p_value_corrected < 2e-5
    assert scores[0].p_value > 1e-3  # Gamma(T, 1) under the wrong key: P(p <= 1e-3) = 1e-3


def test_a_watermarked_passage_inside_random_text_is_found_by_windows():
    wm = GumbelWatermark("gumbel:h=4", KEY, V)
    gen = torch.Generator().manual_seed(4)
    noise = torch.randint(0, V, (600,), generator=gen).tolist()
    ids = noise[:300] + simulate(wm, 128, seed=5) + noise[300:]
    whole = score_text(wm, ids)
    window = best_window(wm, ids)
    assert window.p_value_corrected < 1e-5 < whole.p_value * 1e6
    assert window.start < 300 + 128 and window.end > 300
