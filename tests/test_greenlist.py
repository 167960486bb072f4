"""The keyed PRF, the mixer, green-list statistics, and mask == membership for every scheme."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from watermark.prf import KeyedPRF, green_threshold, mix64, mix64_reference, to_signed64, vocab_mix_table
from watermark.scheme import Watermark

V = 49152
KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))
KGW_SPECS = [
    "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256",
    "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0,prf=hmac-sha256",
    "kgw:scheme=lefthash,h=3,gamma=0.5,delta=2.0,prf=sha3-256",
    "kgw:scheme=minhash,h=4,gamma=0.25,delta=2.0,prf=sha3-256",
    "kgw:scheme=selfhash,h=2,gamma=0.1,delta=1.0,prf=sha3-256",
    "kgw:scheme=unigram,gamma=0.25,delta=2.0,prf=hmac-sha256",
]
ALL_SPECS = KGW_SPECS + [
    "hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0,context_width=1",
    "hf:seeding_scheme=selfhash,greenlist_ratio=0.5,bias=2.0,context_width=3",
]
BINOMIAL_TAIL = 1e-6  # each statistical bound below fails a correct implementation with p <= 2e-6

keys = st.binary(min_size=32, max_size=32)
contexts = st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=8)


def binomial_bounds(n: int, p: float) -> tuple[int, int]:
    return int(stats.binom.ppf(BINOMIAL_TAIL, n, p)), int(stats.binom.isf(BINOMIAL_TAIL, n, p))


# ---- PRF ---------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(key=keys, context=contexts, algorithm=st.sampled_from(["hmac-sha256", "sha3-256"]))
def test_prf_is_deterministic_and_64_bit(key, context, algorithm):
    a = KeyedPRF(key, algorithm, "lefthash").seed(context)
    b = KeyedPRF(key, algorithm, "lefthash").seed(context)
    assert a == b and -(2**63) <= a < 2**63


@settings(max_examples=200, deadline=None)
@given(key1=keys, key2=keys, context=contexts)
def test_prf_separates_keys_algorithms_schemes_and_contexts(key1, key2, context):
    seed = KeyedPRF(key1, "hmac-sha256", "lefthash").seed(context)
    if key1 != key2:
        assert KeyedPRF(key2, "hmac-sha256", "lefthash").seed(context) != seed
    assert KeyedPRF(key1, "sha3-256", "lefthash").seed(context) != seed
    assert KeyedPRF(key1, "hmac-sha256", "minhash").seed(context) != seed
    assert KeyedPRF(key1, "hmac-sha256", "lefthash").seed(context + [1]) != seed


def test_prf_table_matches_single_calls_and_hides_the_key():
    prf = KeyedPRF(KEY_A, "hmac-sha256", "minhash")
    table = prf.table(300)
    assert table.tolist() == [prf.seed([v]) for v in range(300)]
    assert KEY_A.hex() not in repr(prf)
    with pytest.raises(ValueError):
        KeyedPRF(b"short", "hmac-sha256")


@settings(max_examples=300, deadline=None)
@given(seeds=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=8),
       tokens=st.lists(st.integers(0, V - 1), min_size=1, max_size=8))
def test_tensor_mixer_equals_the_reference(seeds, tokens):
    s = torch.tensor(seeds, dtype=torch.int64).unsqueeze(1)
    t = vocab_mix_table(V)[torch.tensor(tokens)].unsqueeze(0)
    got = mix64(s, t)
    assert got.tolist() == [[mix64_reference(a, b) for b in tokens] for a in seeds]


def test_green_threshold_is_gamma_of_the_int64_range():
    for gamma in (0.1, 0.25, 0.5, 0.9):
        assert green_threshold(gamma) == int(gamma * 2**64) - 2**63
    assert to_signed64(2**64 - 1) == -1


# ---- green-list statistics -------------------------------------------------------------------------
@pytest.mark.parametrize("spec", KGW_SPECS)
def test_green_fraction_over_random_contexts_is_gamma(spec):
    wm = Watermark(spec, KEY_A, V)
    gen = torch.Generator().manual_seed(1234)
    n = 10_000
    h = wm.context_width
    ctx = torch.randint(0, V, (n, h), generator=gen)
    cand = torch.randint(0, V, (n,), generator=gen)
    # score each (context, candidate) as the detector does: a sequence of h + 1 tokens
    flags = _flags_for_windows(wm, ctx, cand)
    lo, hi = binomial_bounds(n, wm.gamma)
    assert lo <= int(flags.sum()) <= hi


def _flags_for_windows(wm, ctx, cand):
    from watermark.greenlist import green
    return green(wm._tables, wm.gamma, ctx, cand.unsqueeze(1))[:, 0]


@pytest.mark.parametrize("spec", KGW_SPECS)
def test_each_row_of_a_mask_has_gamma_of_the_vocabulary(spec):
    wm = Watermark(spec, KEY_B, V)
    gen = torch.Generator().manual_seed(99)
    ctx = torch.randint(0, V, (8, wm.context_width), generator=gen)
    counts = wm.green_mask(ctx).sum(dim=1)
    lo, hi = binomial_bounds(V, wm.gamma)
    assert all(lo <= int(c) <= hi for c in counts), counts
    # different contexts give different lists (except unigram: one list)
    distinct = len({tuple(row.nonzero().flatten()[:50].tolist()) for row in wm.green_mask(ctx)})
    assert distinct == (1 if wm.spec.scheme == "unigram" else 8)


def test_lists_under_two_keys_overlap_as_independent_sets():
    """Green under key A and under key B should co-occur with probability gamma**2."""
    a = Watermark(KGW_SPECS[0], KEY_A, V)
    b = Watermark(KGW_SPECS[0], KEY_B, V)
    ctx = torch.randint(0, V, (4, 4), generator=torch.Generator().manual_seed(5))
    both = int((a.green_mask(ctx) & b.green_mask(ctx)).sum())
    lo, hi = binomial_bounds(4 * V, 0.25**2)
    assert lo <= both <= hi


# ---- one function, two shapes ----------------------------------------------------------------------
@pytest.mark.parametrize("spec", ALL_SPECS[:-1])  # hf selfhash has no whole-vocabulary list
def test_generation_mask_equals_detection_membership(spec):
    wm = Watermark(spec, KEY_A, V)
    rng = random.Random(7)
    h = wm.context_width
    seq = [rng.randrange(V) for _ in range(400)]
    flags = wm.green_flags(seq)
    assert flags.shape == (len(seq) - h,)
    ctx = torch.tensor([seq[i - h:i] for i in range(h, len(seq))], dtype=torch.int64).reshape(len(seq) - h, h)
    mask = wm.green_mask(ctx)
    targets = torch.tensor(seq[h:])
    assert torch.equal(mask[torch.arange(len(targets)), targets], flags)


def test_short_sequences_have_no_scorable_positions():
    wm = Watermark(KGW_SPECS[0], KEY_A, V)
    assert wm.green_flags([1, 2, 3, 4]).numel() == 0
    assert wm.green_flags([1, 2, 3, 4, 5]).numel() == 1
    assert wm.ngrams([1, 2, 3, 4, 5, 6]).tolist() == [[1, 2, 3, 4, 5], [2, 3, 4, 5, 6]]


def test_kgw_needs_a_key_and_repr_hides_it():
    with pytest.raises(ValueError, match="key"):
        Watermark(KGW_SPECS[0], None, V)
    wm = Watermark(KGW_SPECS[0], KEY_A, V, key_id="k1")
    assert KEY_A.hex() not in repr(wm) and "k1" in repr(wm)
