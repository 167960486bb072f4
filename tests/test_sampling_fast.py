"""The top-k head path against the full-vocabulary path: the same truncated distributions and, for
seeded rows, the same tokens (the head draws with the same uniform over the same CDF in token-id order)."""

import pytest
import torch

from generation.sample import LogitsPipeline, StepRows
from generation.sample import sampler as sampling
from generation.sample.sampler import (
    HEAD_SPARE,
    SamplerState,
    SamplingParams,
    truncate_,
)

VOCAB = 3000  # (top_k + HEAD_SPARE) * FULL_SORT_FRACTION <= VOCAB for every top_k below, so heads serve them
ROWS = 48
STEPS = 4


def random_logits(rows: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def sample_steps(params: list[SamplingParams], logits_for_step, steps: int) -> tuple[list[list[int]], list[float]]:
    """Tokens per row over `steps` calls, and each row's final mirostat mu."""
    sampler = LogitsPipeline(logits_for_step(0).shape[1], "cpu")
    states = [SamplerState(p, [1, 2, 3], {0}) for p in params]
    out = [[] for _ in params]
    for step in range(steps):
        tokens = sampler.sample(logits_for_step(step), StepRows.of(states)).token_ids.tolist()
        for st, seq, token in zip(states, out, tokens):
            st.append(token)
            seq.append(token)
    return out, [st.mirostat_mu for st in states]


def both_paths(monkeypatch, params, logits_for_step, steps=STEPS):
    """(head path result, full path result, rows the head path served in total)."""
    served = []
    real = sampling.sample_heads

    def counting(*args):
        rows, tokens = real(*args)
        served.append(len(rows))
        return rows, tokens

    monkeypatch.setattr(sampling, "sample_heads", counting)
    fast = sample_steps(params, logits_for_step, steps)
    monkeypatch.setattr(sampling, "TOP_K_HEAD", False)
    full = sample_steps(params, logits_for_step, steps)
    monkeypatch.setattr(sampling, "TOP_K_HEAD", True)
    return fast, full, sum(served)


def step_logits(rows: int, vocab: int = VOCAB, scale: float = 3.0):
    return lambda step: random_logits(rows, vocab, seed=100 + step, scale=scale)


CONFIGS = {
    "top_k": {"top_k": 50},
    "top_k+top_p": {"top_k": 50, "top_p": 0.8, "temperature": 0.8},
    "top_k+min_p": {"top_k": 40, "min_p": 0.1, "temperature": 1.3},
    "top_k+typical": {"top_k": 60, "typical_p": 0.7},
    "top_k+epsilon": {"top_k": 50, "epsilon_cutoff": 0.01, "temperature": 0.7},
    "top_k+eta": {"top_k": 50, "eta_cutoff": 0.01},
    "everything": {"top_k": 100, "top_p": 0.95, "min_p": 0.02, "typical_p": 0.95, "epsilon_cutoff": 1e-3, "eta_cutoff": 1e-3},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_head_path_draws_the_full_paths_tokens(monkeypatch, name):
    params = [SamplingParams(seed=7 * r + 1, **CONFIGS[name]) for r in range(ROWS)]
    (fast, _), (full, _), served = both_paths(monkeypatch, params, step_logits(ROWS))
    assert served == ROWS * STEPS  # the head path really ran
    assert fast == full
    assert len({t for seq in fast for t in seq}) > ROWS  # not one token everywhere: the draw was exercised


def test_mixed_batch_matches_the_full_path(monkeypatch):
    """Head rows next to top-p-only, plain, greedy and mirostat rows (mirostat with top_k stays full)."""
    kinds = [{"top_k": 30, "top_p": 0.9}, {"top_p": 0.9}, {}, {"temperature": 0, "top_k": 5},
             {"mirostat_mode": 2, "top_k": 20}, {"mirostat_mode": 1}, {"top_k": 10, "temperature": 0.5, "min_p": 0.05},
             {"top_k": VOCAB // 2}]  # a head too large to beat the full path
    params = [SamplingParams(seed=r, **kinds[r % len(kinds)]) for r in range(4 * len(kinds))]
    (fast, fast_mu), (full, full_mu), served = both_paths(monkeypatch, params, step_logits(len(params)))
    assert served == 2 * 4 * STEPS  # only the two small top-k kinds without mirostat
    assert fast == full
    assert fast_mu == full_mu  # mirostat rows saw the same surprise


def tied_logits(vocab: int) -> torch.Tensor:
    """Rows whose k-th value (k = 5) is tied: within the spare tokens, past them, and -inf (too few live)."""
    logits = random_logits(3, vocab, seed=9, scale=1.0)
    logits[:, :4] = torch.tensor([9.0, 8.5, 8.0, 7.5])
    logits[0, 10:10 + HEAD_SPARE // 2] = 7.0  # k-th value shared by a few tokens: the head holds them all
    logits[1, 10:10 + 4 * HEAD_SPARE] = 7.0  # shared by more tokens than the head holds: full path
    logits[2, 4:] = float("-inf")  # only 4 live tokens: top_k = 5 keeps all of them, the k-th is -inf
    return logits


def test_ties_at_the_kth_value_fall_back_and_match(monkeypatch):
    logits = tied_logits(VOCAB)
    params = [SamplingParams(seed=50 + r, top_k=5, temperature=0.9) for r in range(3)]
    served_rows = []
    real = sampling.sample_heads

    def recording(*args):
        rows, tokens = real(*args)
        served_rows.append(rows)
        return rows, tokens

    monkeypatch.setattr(sampling, "sample_heads", recording)
    steps = 200  # enough draws that every tied token of row 0 and 1 shows up
    fast, _ = sample_steps(params, lambda step: logits, steps)
    assert all(rows == [0] for rows in served_rows)
    monkeypatch.setattr(sampling, "TOP_K_HEAD", False)
    full, _ = sample_steps(params, lambda step: logits, steps)
    assert fast == full
    head_room = HEAD_SPARE + 1  # tied tokens a head of top_k + HEAD_SPARE holds after the 4 larger ones
    assert len(set(fast[1]) & set(range(10, 10 + 4 * HEAD_SPARE))) > head_room  # the fallback kept more ties
    assert set(fast[2]) <= {0, 1, 2, 3}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_head_truncation_equals_full_row_truncation(name):
    params = [SamplingParams(**CONFIGS[name]) for _ in range(8)]
    for scale in (0.5, 3.0):
        logits = random_logits(8, VOCAB, seed=11, scale=scale)
        full = logits.clone()
        truncate_(full, params)
        values, ids = logits.topk(params[0].top_k + HEAD_SPARE)
        truncate_(values, params, presorted=True)
        head = torch.full_like(logits, float("-inf")).scatter_(1, ids, values)
        assert torch.equal(torch.isinf(head), torch.isinf(full))
        assert torch.equal(head, full)  # survivors keep their logits untouched
        torch.testing.assert_close(values.softmax(-1), full.gather(1, ids).softmax(-1), rtol=1e-6, atol=1e-7)
    assert (torch.isfinite(full).sum(-1) < params[0].top_k).any() or name == "top_k"  # later truncations acted
