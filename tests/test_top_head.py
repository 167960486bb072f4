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
