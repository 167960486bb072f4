"""synthid: specs: keyed g-values (one definition for generation and detection), the tournament's
closed form against brute-force enumeration, non-distortion over contexts, detection."""

import hashlib
import itertools
import math

import numpy as np
import pytest
import torch

from detector.scoring_sampling import best_window, score_keys, score_text
from watermark.sampling_common import SeenContexts
from watermark.sampling_stats import synthid_layer_weights
from watermark.synthid import SynthIDWatermark, layer_bits, tournament_probs

V = 49152
KEY = hashlib.sha256(b"provmark-test/synthid").digest()


def test_whole_vocabulary_and_detection_g_values_agree():
    wm = SynthIDWatermark("synthid:h=3,layers=20", KEY, V)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (10,), generator=gen)
    g, units = wm.scored_positions(ids)
    assert g.shape == (7, 20) and units.shape == (7, 4)
    full = layer_bits(wm.words(units[:, :3]), 20)  # [7, V, 20]
    assert torch.equal(full[torch.arange(7), units[:, 3]], g)


def brute_force_winner(p: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Tournament over 2^m i.i.d. draws from p: each match keeps the larger g of the layer, a tie
    keeps either with probability 1/2. Enumerates every draw (V^(2^m) of them)."""
    layers = g.shape[1]
    out = np.zeros_like(p)
    for draw in itertools.product(range(len(p)), repeat=2 ** layers):
        weight = np.prod(p[list(draw)])
        players = [{v: 1.0} for v in draw]  # distribution over who stands in each slot
        for d in range(layers):
            nxt = []
            for a, b in zip(players[::2], players[1::2]):
                dist: dict[int, float] = {}
                for (x, px), (y, py) in itertools.product(a.items(), b.items()):
                    if g[x, d] == g[y, d]:
                        dist[x] = dist.get(x, 0) + px * py / 2
                        dist[y] = dist.get(y, 0) + px * py / 2
                    else:
                        w = x if g[x, d] > g[y, d] else y
                        dist[w] = dist.get(w, 0) + px * py
                nxt.append(dist)
            players = nxt
        for v, pv in players[0].items():
            out[v] += weight * pv
    return out


def test_closed_form_equals_the_tournament_enumerated():
    p = np.array([0.5, 0.2, 0.2, 0.1])
    g = np.array([[0, 1], [1, 0], [1, 1], [0, 0]])
    closed = tournament_probs(torch.from_numpy(p[None]),
                              lambda d: None if d >= 2 else torch.from_numpy(g[None, :, d].astype(np.float64)))
    assert np.allclose(closed[0].numpy(), brute_force_winner(p, g), atol=1e-12)


def test_over_contexts_the_tournament_keeps_the_distribution():
    """E over fresh contexts of the winner distribution is p. Each entry p'_v lies in [0, 2^m p_v], so by
    Hoeffding the mean of n contexts is within 2^m p_v sqrt(log(2 V / 1e-6) / (2 n)) of p_v w.p. >= 1 - 1e-6."""
    small, layers, n = 5, 2, 4000
    wm = SynthIDWatermark(f"synthid:h=1,layers={layers}", KEY, small)
    logits = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], dtype=torch.float64)).expand(n, -1)
    probs = torch.softmax(wm.tournament_logits(logits, torch.arange(n).reshape(n, 1)), dim=-1).mean(0).numpy()
    p = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    bound = 2**layers * p * math.sqrt(math.log(2 * small / 1e-6) / (2 * n))
    assert np.all(np.abs(probs - p) <= bound), (probs, p, bound)


def test_weights_follow_synthid_linear_decay_and_sum_to_m():
    w = synthid_layer_weights(30)
    assert w.sum() == pytest.approx(30) and w[0] / w[-1] == pytest.approx(10) and np.all(np.diff(w) < 0)


def simulate(wm, length, seed, top=8):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (wm.context_width,), generator=gen).tolist()
    seen = SeenContexts()
    for _ in range(length):
        logits = torch.full((1, V), float("-inf"))
        logits[0, torch.randint(0, V, (top,), generator=gen)] = torch.randn(top, generator=gen) * 1.5
        context = tuple(ids[-wm.context_width:])
        if seen.first_time(context):
            logits = wm.tournament_logits(logits, torch.tensor([context]))
        ids.append(int(torch.multinomial(torch.softmax(logits[0], 0), 1, generator=gen)))
    return ids


def test_simulated_watermarked_text_is_detected_by_its_key_only():
    wm = SynthIDWatermark("synthid:h=4,layers=30", KEY, V, key_id="right")
    other = SynthIDWatermark("synthid:h=4,layers=30", hashlib.sha256(b"other").digest(), V, key_id="other")
    ids = simulate(wm, 200, seed=3)
    score = score_text(wm, ids)
    assert score.p_value < 1e-5 and score.mean_g > 0.5 and score.weighted_mean_g > score.mean_g
    best, scores = score_keys([other, wm], ids)
    assert best.key_id == "right" and scores[0].p_value > 1e-3
    window = best_window(wm, ids)
    assert window is not None and window.p_value_corrected < 1e-5 and window.end - window.start == 128


def test_top_k_tournament_is_the_full_tournament_of_the_truncated_distribution():
    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(4, V, generator=gen) * 2
    contexts = torch.randint(0, V, (4, 4), generator=gen)
    top = SynthIDWatermark("synthid:h=4,layers=30,top_k=40", KEY, V).tournament_logits(logits, contexts)
    truncated = torch.full_like(logits, float("-inf"))
    index = torch.topk(logits, 40, dim=-1).indices
    truncated.scatter_(1, index, logits.gather(1, index))
    full = SynthIDWatermark("synthid:h=4,layers=30,top_k=0", KEY, V).tournament_logits(truncated, contexts)
    kept = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, index, True)
    assert torch.allclose(top[kept], full[kept], atol=1e-5)
    assert torch.all(torch.softmax(top, -1)[~kept] == 0)


def _tournament_inputs(seed: int, rows: int, width: int):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.rand(rows, width, generator=gen, dtype=torch.float64).pow(6).float()
    probs[:, 1::5] = 0  # truncated tokens
    probs = probs / probs.sum(-1, keepdim=True)
    words = torch.randint(-2**63, 2**63 - 1, (rows, width), generator=gen, dtype=torch.int64)
    return probs, words


def _plain_sequential(probs: torch.Tensor, words: torch.Tensor, layers: int) -> torch.Tensor:
    """The definition written out: per row and layer, E_p[g] summed in column order in Python floats
    (float64) and rounded to float32; then p * ((1 + g) - mass) in float32."""
    out = probs.clone()
    for b in range(out.shape[0]):
        for d in range(layers):
            g = ((words[b] >> d) & 1).to(torch.float32)
            mass = torch.tensor(sum(float(p) for p, bit in zip(out[b], g) if bit), dtype=torch.float32)
            out[b] = out[b] * ((1 + g) - mass)
    return out.clamp_min(0)


def test_a_mass_rounded_above_one_leaves_no_negative_probability():
    """One token holding nearly all the mass with g = 1: 1 - mass rounds below 0 for the others; the
    winner distribution stays a distribution (draws and multinomial need p >= 0)."""
    from watermark import synthid

    probs = torch.tensor([[0.7, 0.3000001, 1e-8]], dtype=torch.float32)  # a normalised row, rounded
    words = torch.tensor([[1, 1, 0]], dtype=torch.int64)  # layer 0: the two big tokens win, the last loses
    mass = torch.cumsum(probs * words, dim=1)[:, -1]
    assert float(mass) > 1.0  # the rounding this is about
    winner = synthid.sequential_tournament(probs, words, 1)
    assert bool((winner >= 0).all()) and float(winner[0, 2]) == 0.0


@pytest.mark.parametrize("seed, rows, width, layers", [(0, 16, 40, 30), (1, 3, 7, 64), (2, 5, 300, 12), (3, 2, 1, 30)])
def test_sequential_tournament_is_its_definition_with_and_without_the_kernel(seed, rows, width, layers, monkeypatch):
    """``sequential_tournament``: the tensor ops (torch.cumsum accumulates float32 in float64 on the CPU) and
    the engine's C++ kernel give the written-out definition's bits."""
    from generation.cpu import native
    from watermark import synthid

    probs, words = _tournament_inputs(seed, rows, width)
    expected = _plain_sequential(probs, words, layers)
    monkeypatch.setattr(synthid, "_tournament_backend", None)
    assert torch.equal(synthid.sequential_tournament(probs, words, layers), expected)
    if native.available(torch.float32, torch.device("cpu")):
        assert torch.equal(native.synthid_tournament(probs, words, layers), expected)
        monkeypatch.setattr(synthid, "_tournament_backend", native.synthid_tournament)
        assert torch.equal(synthid.sequential_tournament(probs, words, layers), expected)
    elif __import__("os").environ.get("CI"):
        raise AssertionError("CI: the native kernels must build here")


def test_a_head_plays_the_tournament_of_its_whole_row_bit_for_bit():
    """The tokens outside a row's head have p = 0; with the sum in id order they add nothing anywhere, so
    the head's winner probabilities equal the whole row's at the head's ids, bit for bit."""
    wm = SynthIDWatermark("synthid:h=4,layers=30,top_k=0", KEY, V)
    gen = torch.Generator().manual_seed(9)
    probs = torch.softmax(torch.randn(4, V, generator=gen) * 3, dim=-1)
    ids = torch.topk(probs, 40, dim=-1).indices.sort(dim=-1).values
    head = probs.gather(1, ids)
    head = head / head.sum(-1, keepdim=True)
    contexts = torch.randint(0, V, (4, 4), generator=gen)
    whole = torch.zeros_like(probs).scatter_(1, ids, head)
    winner_head, got_ids = wm.winner_distribution(head, contexts, ids)
    winner_whole, none = wm.winner_distribution(whole, contexts)
    assert torch.equal(got_ids, ids) and none is None
    assert torch.equal(winner_whole.gather(1, ids), winner_head)
    assert torch.count_nonzero(winner_whole) == torch.count_nonzero(winner_head)
