"""hf specs reproduce transformers' WatermarkLogitsProcessor green lists and biasing exactly."""

import pytest
import torch
from transformers.generation.logits_process import WatermarkLogitsProcessor

from watermark.processor import WatermarkProcessor
from watermark.scheme import Watermark

V = 49152
CASES = [("lefthash", 1, 0.25, 15485863), ("lefthash", 3, 0.5, 42), ("selfhash", 1, 0.25, 15485863),
         ("selfhash", 4, 0.25, 7)]


def _spec(scheme, width, gamma, key, bias=2.0):
    return (f"hf:seeding_scheme={scheme},greenlist_ratio={gamma},bias={bias},"
            f"hashing_key={key},context_width={width}")


@pytest.mark.parametrize("scheme, width, gamma, key", CASES)
def test_green_lists_equal_transformers_token_for_token(scheme, width, gamma, key):
    reference = WatermarkLogitsProcessor(V, "cpu", greenlist_ratio=gamma, hashing_key=key,
                                         seeding_scheme=scheme, context_width=width)
    ours = Watermark(_spec(scheme, width, gamma, key), None, V)._hf
    gen = torch.Generator().manual_seed(11)
    for _ in range(25):
        seq = torch.randint(0, V, (width + 3,), generator=gen)
        expected = reference._get_greenlist_ids(seq)
        got = ours.greenlist(ours.seed(seq.tolist()))
        assert torch.equal(got, expected)


@pytest.mark.parametrize("scheme, width, gamma, key", CASES)
def test_biased_logits_equal_transformers_processor(scheme, width, gamma, key):
    reference = WatermarkLogitsProcessor(V, "cpu", greenlist_ratio=gamma, hashing_key=key,
                                         seeding_scheme=scheme, context_width=width, bias=2.5)
    wm = Watermark(_spec(scheme, width, gamma, key, bias=2.5), None, V)
    gen = torch.Generator().manual_seed(12)
    input_ids = torch.randint(0, V, (3, 9), generator=gen)
    logits = torch.randn(3, V, generator=gen)
    expected = reference(input_ids, logits.clone())
    got = WatermarkProcessor().apply(logits.clone(), input_ids.tolist(), [wm] * 3)
    assert torch.equal(got, expected)
    assert not torch.equal(got, logits)


def test_detection_membership_follows_transformers_ngrams():
    """lefthash scores token i with the green list of its prefix; selfhash with the list of the
    window that ends with the token itself (transformers' WatermarkDetector)."""
    gen = torch.Generator().manual_seed(13)
    seq = torch.randint(0, V, (30,), generator=gen)
    for scheme, width in (("lefthash", 2), ("selfhash", 2)):
        reference = WatermarkLogitsProcessor(V, "cpu", seeding_scheme=scheme, context_width=width)
        wm = Watermark(_spec(scheme, width, 0.25, 15485863), None, V)
        n = width + 1 - (scheme == "selfhash")
        expected = []
        for start in range(len(seq) - n + 1):
            window = seq[start:start + n]
            prefix = window if scheme == "selfhash" else window[:-1]
            expected.append(bool(window[-1] in reference._get_greenlist_ids(prefix)))
        assert wm.green_flags(seq).tolist() == expected
