"""hf:synthid specs reproduce transformers' SynthIDTextWatermarkLogitsProcessor and DeepMind's
synthid-text bit for bit: g-values, the tournament update and the processor's state over steps."""

import hashlib

import pytest
import torch
from transformers.generation.logits_process import SynthIDTextWatermarkLogitsProcessor

from detector.scoring_sampling import positions, score_text
from watermark.hf_synthid import HFSynthID, HFSynthIDState

V = 49152
KEYS = [654, 400, 836, 123, 340, 443, 597, 160, 57, 2**62 + 12345, -77, 3]
CASES = [(5, 0, 2**16), (3, 7, 1000), (2, 11, 2**20)]


def _spec(keys, ngram_len, seed, size, history=1024):
    return (f"hf:synthid,keys={':'.join(map(str, keys))},ngram_len={ngram_len},sampling_table_seed={seed},"
            f"sampling_table_size={size},context_history_size={history}")


def _reference(keys, ngram_len, seed, size, history=1024):
    return SynthIDTextWatermarkLogitsProcessor(ngram_len=ngram_len, keys=keys, sampling_table_size=size,
                                               sampling_table_seed=seed, context_history_size=history,
                                               device=torch.device("cpu"))


@pytest.mark.parametrize("ngram_len, seed, size", CASES)
def test_g_values_equal_transformers(ngram_len, seed, size):
    ours = HFSynthID(_spec(KEYS, ngram_len, seed, size), V)
    reference = _reference(KEYS, ngram_len, seed, size)
    assert torch.equal(ours.table, reference.sampling_table)
    ids = torch.randint(0, V, (4, 90), generator=torch.Generator().manual_seed(ngram_len))
    assert torch.equal(ours.g_values(ids), reference.compute_g_values(ids))
    g, units = ours.scored_positions(ids[1])
    assert torch.equal(g.long(), reference.compute_g_values(ids[1:2])[0])


# Digests of synthid-text 0.2.1's ``SynthIDLogitsProcessor.compute_g_values`` (uint8 bytes) for the
# keys above and ids = torch.randint(0, V, (3, 80), generator=torch.Generator().manual_seed(2026)),
# computed with that package in its own venv (torch 2.13.0): it imports transformers and jax, which
# the project does not depend on.
SYNTHID_TEXT_DIGESTS = {
    (5, 0, 2**16): "d42d1f0cb4e6b2e17ffebe222f657415b89c0ecb4cfa23d594a79b4e0d7de043",
    (3, 7, 1000): "59635fea828193d844bf83c25a96f0bc1328cbc2a4366b6aa1d32a679d65b6f6",
}


@pytest.mark.parametrize("case", sorted(SYNTHID_TEXT_DIGESTS))
def test_g_values_equal_deepmind_synthid_text(case):
    ours = HFSynthID(_spec(KEYS, *case), V)
    ids = torch.randint(0, V, (3, 80), generator=torch.Generator().manual_seed(2026))
    g = ours.g_values(ids).to(torch.uint8)
    assert hashlib.sha256(g.numpy().tobytes()).hexdigest() == SYNTHID_TEXT_DIGESTS[case]


@pytest.mark.parametrize("ngram_len, seed, size", CASES[:2])
def test_processor_steps_equal_transformers_bit_for_bit(ngram_len, seed, size):
    """Six steps of generation state: zero-padded context, shifting, repeated-context rows untouched."""
    reference = _reference(KEYS[:6], ngram_len, seed, size, history=8)
    ours = HFSynthID(_spec(KEYS[:6], ngram_len, seed, size, history=8), V)
    state = HFSynthIDState(ours, 3)
    gen = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, V, (3, 7), generator=gen)
    for step in range(6):
        scores = torch.randn(3, V, generator=gen)
        scores[:, :100] = float("-inf")  # an earlier top-k style truncation
        expected = reference(input_ids, scores.clone())
        got = state(input_ids, scores.clone())
        assert torch.equal(got, expected), step
        nxt = torch.randint(0, V, (3, 1), generator=gen)
        if step == 2:
            nxt[0] = input_ids[0, -1]  # row 0 repeats a context later on
        input_ids = torch.cat([input_ids, nxt], dim=1)


def test_null_rate_is_the_tables_exact_fraction_and_units_collapse_equal_hashes():
    ours = HFSynthID(_spec(KEYS, 5, 0, 2**16), V)
    assert ours.null_g_rate == ours.table.float().mean().item() and ours.null_g_rate != 0.5
    ids = torch.randint(0, V, (60,), generator=torch.Generator().manual_seed(4))
    repeated = torch.cat([ids, ids[10:30]])
    values, prev = positions(ours, repeated)
    assert (prev >= 0).sum() == 20 - 4  # the repeated 5-grams inside the copy
    assert score_text(ours, repeated).num_tokens_scored == 76 - 16


def test_detector_masks_equal_transformers():
    """The inputs of transformers' SynthIDTextWatermarkDetector besides g-values: the repeated-context
    mask (history window of 16 here, so contexts also fall out of it) and the EOS mask."""
    from watermark.hf_synthid import before_eos_mask, fresh_context_mask

    reference = _reference(KEYS[:4], 3, 0, 2**16, history=16)
    ours = HFSynthID(_spec(KEYS[:4], 3, 0, 2**16, history=16), V)
    gen = torch.Generator().manual_seed(8)
    base = torch.randint(0, 9, (120,), generator=gen)  # 81 contexts: repeats near and beyond the window
    base[90] = 7
    ids = base.unsqueeze(0)
    expected = reference.compute_context_repetition_mask(ids)[0].bool()
    assert torch.equal(fresh_context_mask(ours, base), expected)
    assert 0 < int((~expected).sum()) < expected.shape[0]
    expected_eos = reference.compute_eos_token_mask(ids, 7)[:, 2:][0].bool()
    assert torch.equal(before_eos_mask(ours, base, 7), expected_eos)


def test_a_heads_tournament_takes_every_layer_at_once_bit_for_bit(monkeypatch):
    """On a head (truncated rows, or given candidates) every layer's g-values come from one pass; the
    winner distribution equals the layer-by-layer update's, bit for bit."""
    import watermark.hf_synthid as hf_synthid

    ours = HFSynthID(_spec(KEYS, 5, 0, 2**16), V)
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(4, V, generator=gen) * 3
    scores[scores < scores.topk(50, dim=-1).values[:, -1:]] = float("-inf")  # top-k 50 rows
    probs = scores.softmax(-1)
    contexts = torch.randint(0, V, (4, 4), generator=gen)
    fast, fast_ids = ours.winner_distribution(probs, contexts)
    monkeypatch.setattr(hf_synthid, "ALL_LAYERS_AT_ONCE", 0)
    slow, slow_ids = ours.winner_distribution(probs, contexts)
    assert fast_ids.shape == (4, 50) and torch.equal(fast_ids, slow_ids) and torch.equal(fast, slow)
