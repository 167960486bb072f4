"""Spoofing with stolen colours: the public base model steered by the attacker's colour table.

``SpoofMark`` plugs into the engine's watermark stage (``generation.sample.watermark_stage``) as a
watermark of its own: at each step it adds ``delta * min(score, 1)`` to every next token the stolen table
scores above 0 after the row's context (the paper's "boost what you believe green"), no key involved. The
attacker also edits human text with the table (``spoof_edit``): positions believed red get the base
model's candidate believed greenest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
import torch

from evaluation.stealing import ColourEstimate
from generation.sample.stage import WatermarkStage

SCORE_CAP = 1.0  # a pair score of 1 (e^1 more often than the base model predicts) gets the full delta
CANDIDATES = 50  # base-model candidates an edit chooses from (as evaluation.attacks_model)


class SpoofStage(WatermarkStage):
    """Adds the stolen bias to the rows it serves; never chooses tokens."""

    chooses_tokens = False

    def transform_(self, scores: torch.Tensor, contexts: Sequence[Sequence[int]], marks: Sequence,
                   code: Sequence[bool] | None = None) -> None:
        for row, (context, mark) in enumerate(zip(contexts, marks)):
            if mark is None or len(context) < mark.context_width:
                continue
            found, known = mark.estimate.row_scores(list(context))
            bias = mark.delta * np.clip(np.where(known, found, 0.0), 0.0, SCORE_CAP) / SCORE_CAP
            width = min(bias.shape[0], scores.shape[1])
            scores[row, :width] += torch.from_numpy(bias[:width]).to(scores.dtype)


SPOOF_STAGE = SpoofStage()


class SpoofMark:
    """What the engine needs of a watermark, carrying the attacker's table instead of a key."""

    pipeline_stage = SPOOF_STAGE
    key_id = None

    def __init__(self, estimate: ColourEstimate, delta: float, label: str) -> None:
        self.estimate = estimate
        self.delta = float(delta)
        self.vocab_size = estimate.vocab_size
        self.context_width = estimate.window
        self.spec = SimpleNamespace(hard=False, format=lambda: f"spoof:{label},delta={self.delta:g}")
        # the cache key of its generations: the table's content and the bias
        digest = hashlib.sha256(estimate.digest_material() + repr(self.delta).encode()).hexdigest()
        self.fingerprint = f"spoof:{label}:{digest[:24]}"


def spoof_edit(estimate: ColourEstimate, ids: list[int], logits: torch.Tensor, positions: list[int],
               rate: float, rng) -> list[int]:
    """Human text ``ids`` with a fraction ``rate`` of its tokens replaced: the positions believed reddest
    (ties at random) get the candidate believed greenest among the base model's top ``CANDIDATES`` there
    (``logits`` [len(positions), V] from the original text)."""
    return _edit(estimate, ids, logits, positions, rate, rng, greener=True)


def _edit(estimate: ColourEstimate, ids: list[int], logits: torch.Tensor, positions: list[int], rate: float,
          rng, greener: bool) -> list[int]:
    w = estimate.window
    ids = list(ids)
    usable = [(k, p) for k, p in enumerate(positions) if p >= w]
    budget = min(len(usable), round(rate * len(ids)))
    if budget == 0:
        return ids
    units = np.array([ids[p - w: p + 1] for _, p in usable], dtype=np.int64)
    scores, _ = estimate.unit_scores(units)
    jitter = np.array([rng.random() for _ in usable])
    order = np.lexsort((jitter, scores if greener else -scores))  # reddest first to spoof, greenest to scrub
    for j in order[:budget]:
        k, p = usable[j]
        top = torch.topk(logits[k], min(CANDIDATES, logits.shape[-1])).indices.numpy()
        top = top[top != ids[p]]
        cand = np.concatenate([np.repeat(np.array(ids[p - w: p], dtype=np.int64)[None], len(top), 0), top[:, None]], 1)
        cand_scores, _ = estimate.unit_scores(cand)
        if greener or (cand_scores < 0).any():
            pick = int(np.argmax(cand_scores)) if greener else int(np.argmin(cand_scores))  # ties: most probable
        else:
            # nothing believed red: draw like a blind edit among the candidates not believed green (the most
            # probable one is often a common unit the detector does not count, which costs it less than a red)
            allowed = np.flatnonzero(cand_scores <= 0)
            if allowed.size == 0:
                continue
            weights = torch.softmax(logits[k][torch.as_tensor(top[allowed])].double(), dim=-1).tolist()
            pick = int(rng.choices(list(allowed), weights=weights)[0])
        ids[p] = int(top[pick])
    return ids


def scrub_edit(estimate: ColourEstimate, ids: list[int], logits: torch.Tensor, positions: list[int],
               rate: float, rng) -> list[int]:
    """Watermarked ``ids`` with a fraction ``rate`` of its tokens replaced: the positions believed greenest
    get the base model's candidate believed reddest (the scrubbing attack)."""
    return _edit(estimate, ids, logits, positions, rate, rng, greener=False)
