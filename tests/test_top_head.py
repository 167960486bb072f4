"""generation.sample.top_head against torch.topk: the same values and ids, bit for bit, on seeded random
rows with and without ties (rounded to bfloat16), NaN, infinities, strided (padded) rows and tiny widths."""

import os

import pytest
import torch

from generation.cpu import native
from generation.sample import top_head as top_head_module
from generation.sample.top_head import top_head

if not native.available(torch.float32, torch.device("cpu")):
    if os.environ.get("CI"):
        raise RuntimeError("CI: the native kernels must build here (is g++ installed?)")
    pytest.skip("no C++ compiler: the native kernels are not built", allow_module_level=True)


@pytest.fixture
def native_backend(monkeypatch):
    monkeypatch.setattr(top_head_module, "_backend", native.top_head)


def rows(seed: int, count: int, width: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed)) * scale


def assert_topk(scores: torch.Tensor, size: int) -> None:
    values, ids = top_head(scores, size)
    expected_values, expected_ids = scores.topk(size)
    assert torch.equal(values, expected_values) or torch.allclose(values, expected_values, equal_nan=True)
    assert torch.equal(ids, expected_ids)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("size", [1, 17, 66])
def test_distinct_rows_match_topk(native_backend, seed, size):
    scores = rows(seed, 16, 49152 if seed % 2 else 3001)  # 3001: a last chunk shorter than 64
    found = native.top_head(scores, size)
    assert found is not None and bool(found[2].all())  # distinct float32 rows: the kernel serves them all
    assert_topk(scores, size)


@pytest.mark.parametrize("seed", range(4))
def test_ties_fall_back_to_topk(native_backend, seed):
    scores = rows(seed, 16, 8192)
    scores[::2] = scores[::2].to(torch.bfloat16).to(torch.float32)  # half the rows tie in their heads
    values, ids, ok = native.top_head(scores, 66)
    assert not bool(ok[::2].any()) and bool(ok[1::2].all())
    assert_topk(scores, 66)


def test_nan_infinities_and_short_rows(native_backend):
    scores = rows(7, 6, 4096)
    scores[0, 100] = float("nan")
    scores[1, 5:] = float("-inf")  # fewer finite values than the head: -inf ties
    scores[2, 7] = float("inf")
    scores[3, :4000] = float("-inf")  # 96 finite values
    scores[4, 3000] = 1e30
    ok = native.top_head(scores, 66)[2]
    assert ok.tolist() == [False, False, True, True, True, True]
    assert_topk(scores, 66)
    assert_topk(rows(8, 3, 40), 20)  # fewer chunks than the head: torch.topk
    assert_topk(rows(9, 1, 300), 66)


def test_strided_rows_and_whole_row_heads(native_backend):
    padded = rows(10, 8, 5000)
    assert_topk(padded[:, :4900], 66)  # vLLM's padded logits, sliced to the vocabulary
    assert_topk(padded[3:4, :4900], 66)  # one row
    assert_topk(padded[:, :66], 66)  # the head is the whole row: torch.topk


@pytest.mark.parametrize("spec", ["synthid:h=4", "synthid:h=2,layers=12,top_k=7"])
@pytest.mark.parametrize("ties", [False, True])
def test_synthid_stage_head_is_the_tournaments_own_top_k(native_backend, spec, ties):
    """The sampling stage hands SynthID its top_k head found by the kernel; the winner distribution and the
    drawn tokens equal those of ``winner_distribution``'s own torch.topk over the whole row, bit for bit
    (rows with ties, rounded to bfloat16, fall back to torch.topk and agree as well)."""
    from generation.sample.sampling_stage import SAMPLING_STAGE, _head
    from watermark.scheme import make_watermark

    vocab = 3001
    mark = make_watermark(spec, b"k" * 32, vocab, "k")
    logits = rows(11, 9, vocab)
    if ties:
        logits = logits.to(torch.bfloat16).float()
    probs = logits.softmax(-1)
    contexts = torch.randint(0, vocab, (9, mark.context_width), generator=torch.Generator().manual_seed(3))
    head, ids = _head(probs, mark.head_size)
    fast, fast_ids = mark.winner_distribution(head, contexts, ids)
    own, own_ids = mark.winner_distribution(probs, contexts)
    assert torch.equal(fast_ids, own_ids) and torch.equal(fast, own)
    tokens = SAMPLING_STAGE.choose(probs, contexts.tolist(), [mark] * 9,
                                   [torch.Generator().manual_seed(i) for i in range(9)])
    expected = own_ids.gather(1, sampling_draw(own, 9))[:, 0]
    assert torch.equal(tokens, expected)


def sampling_draw(probs: torch.Tensor, count: int) -> torch.Tensor:
    from generation.sample.sampler import draw_

    return draw_(probs, [torch.Generator().manual_seed(i) for i in range(count)])[:, None]
