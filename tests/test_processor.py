"""WatermarkProcessor: soft and hard biasing, per-row specs and keys."""

import pytest
import torch

from watermark.processor import WatermarkProcessor, warm_up
from watermark.scheme import Watermark

V = 49152
KEY_A = bytes(range(32))
KEY_B = bytes(range(7, 39))
SOFT = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256"


def _histories(n, length=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (length,), generator=gen).tolist() for _ in range(n)]


def _contexts(histories, h):
    return torch.tensor([hist[len(hist) - h:] for hist in histories]).reshape(len(histories), h)


def test_soft_mode_moves_green_logits_by_exactly_delta():
    wm = Watermark(SOFT, KEY_A, V)
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    before = logits.clone()
    hist = _histories(3)
    WatermarkProcessor().apply(logits, hist, [wm] * 3)
    mask = wm.green_mask(_contexts(hist, 4))
    assert torch.equal(logits[mask], before[mask] + 2.0)
    assert torch.equal(logits[~mask], before[~mask])


def test_hard_mode_gives_red_tokens_zero_probability():
    wm = Watermark(SOFT + ",hard", KEY_A, V)
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(2)) * 5
    before = logits.clone()
    hist = _histories(2)
    WatermarkProcessor().apply(logits, hist, [wm, wm])
    probs = torch.softmax(logits, dim=-1)
    mask = wm.green_mask(_contexts(hist, 4))
    assert torch.all(probs[~mask] == 0)
    assert torch.equal(logits[mask], before[mask])
    assert torch.allclose(probs.sum(dim=-1), torch.ones(2))


def test_rows_with_different_keys_specs_or_none_are_each_biased_as_if_alone():
    a = Watermark(SOFT, KEY_A, V)
    b = Watermark(SOFT, KEY_B, V)
    c = Watermark("kgw:scheme=lefthash,h=1,gamma=0.5,delta=3.0", KEY_A, V)
    rows = [a, None, b, c, a, None]
    hist = _histories(len(rows), seed=3)
    hist[4] = hist[4][:2]  # too short for h = 4: left untouched
    logits = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(4))
    expected = logits.clone()
    for i, wm in enumerate(rows):
        if wm is not None:
            expected[i:i + 1] = wm.bias(expected[i:i + 1].clone(), [hist[i]])
    WatermarkProcessor().apply(logits, hist, rows)
    assert torch.equal(logits, expected)
    original = torch.randn(len(rows), V, generator=torch.Generator().manual_seed(4))
    assert torch.equal(logits[[1, 4, 5]], original[[1, 4, 5]])
    assert not torch.equal(logits[0], original[0])
    # the two keys bias different tokens on the same history
    assert not torch.equal(a.green_mask(_contexts(hist[:1], 4)), b.green_mask(_contexts(hist[:1], 4)))


def test_processor_rejects_mismatched_rows():
    import pytest
    with pytest.raises(ValueError):
        WatermarkProcessor().apply(torch.zeros(2, V), [[1]], [None, None])


@pytest.mark.parametrize("spec", [
    "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",
    "kgw:scheme=selfhash,h=2,gamma=0.5,delta=1.0,hard",
    "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0",
    "kgw:scheme=lefthash,h=3,gamma=0.25,delta=2.0,prf=sha3-256,hard",
    "kgw:scheme=minhash,h=4,gamma=0.25,delta=3.5",
    "kgw:scheme=unigram,gamma=0.5,delta=2.0",
])
def test_compiled_bias_equals_eager_tensors_and_the_mask(spec, monkeypatch):
    from watermark import greenlist
    wm = Watermark(spec, KEY_A, V)
    for batch in (1, 5, 16):
        hist = _histories(batch, seed=batch)
        logits = torch.randn(batch, V, generator=torch.Generator().manual_seed(batch))
        compiled = wm.bias(logits.clone(), hist)
        monkeypatch.setattr(greenlist.kernels, "enabled", False)
        eager = wm.bias(logits.clone(), hist)
        monkeypatch.setattr(greenlist.kernels, "enabled", True)
        assert torch.equal(compiled, eager)
        mask = wm.green_mask(_contexts(hist, wm.context_width))
        if wm.spec.hard:
            assert torch.equal(torch.isinf(compiled), ~mask)
        else:
            assert torch.equal(compiled, torch.where(mask, logits + wm.spec.delta, logits))


def test_rows_with_equal_spec_and_key_are_biased_in_one_call(monkeypatch):
    """One Watermark object per request must not split a batch into per-row calls."""
    calls = []
    original = Watermark.bias

    def counting(self, logits, histories):
        calls.append(logits.shape[0])
        return original(self, logits, histories)

    monkeypatch.setattr(Watermark, "bias", counting)
    rows = [Watermark(SOFT, KEY_A, V) for _ in range(4)] + [Watermark(SOFT, KEY_B, V)]
    assert rows[0].batch_key == rows[1].batch_key != rows[4].batch_key
    hist = _histories(5, seed=9)
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(9))
    expected = logits.clone()
    for i, wm in enumerate(rows):
        expected[i:i + 1] = original(wm, expected[i:i + 1].clone(), [hist[i]])
    WatermarkProcessor().apply(logits, hist, rows)
    assert sorted(calls[-2:]) == [1, 4]
    assert torch.equal(logits, expected)


def test_warm_up_compiles_the_default_kernel_before_any_request(monkeypatch):
    from watermark import greenlist

    fresh = greenlist._Kernels()  # nothing compiled yet in this "process"
    monkeypatch.setattr(greenlist, "kernels", fresh)
    monkeypatch.setattr(greenlist, "_bias_backend", None)  # an engine built earlier registers its C++ kernel
    if not fresh.enabled:
        pytest.skip("PROVMARK_COMPILE is off: there is nothing to warm up")
    warm_up(1000)
    assert "selfhash" in fresh.compiled  # the default spec's kernel: a request now finds it ready
    assert fresh.enabled  # the compile worked (a failure would have switched the kernels to eager)
