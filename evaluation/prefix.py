"""Exact p-values of every prefix of one text under one key, from one scoring pass: what the detector
would say if the first L tokens were pasted alone, for every L (tokens to detect, detection by length).

KGW: running green and scored counts, binomial tail. Gumbel: running sum of -log(1 - r) over counted
units, Gamma tail. SynthID: running count of g = 1 over units x layers, binomial tail. Which units the
common-unit table leaves out depends on the text's length (``detector.common_units.threshold_for_length``),
so each prefix uses its own length's threshold.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import special

from detector.common_units import threshold_for_length, threshold_of
from detector.scoring import _previous, counted_positions, score_positions
from watermark.schemes import family_of
from watermark.specs import is_sampling
from watermark.stats import binomial_sf
from watermark.units import identities as unit_identities


def prefix_p_values(watermark, token_ids, dedup: bool = True, common=None,
                    margins: np.ndarray | None = None) -> np.ndarray:
    """Float [T + 1]: entry L is the exact p-value of the first L tokens (1 where nothing is scored). ``margins``
    (kgw specs; ``detector.promise.prefix_margins``): entry L is the margin of the verdict's promise on those tokens,
    and the p-value is held to it as the verdict's is (P(Z >= z - margin) where that is larger)."""
    ids = torch.as_tensor(list(token_ids), dtype=torch.int64)
    total_tokens = int(ids.shape[0])
    p = np.ones(total_tokens + 1, dtype=np.float64)
    family = family_of(watermark.spec)
    if total_tokens <= watermark.context_width and not family.scores_every_token:
        return p
    if is_sampling(watermark.spec):
        values, units = watermark.scored_positions(ids)
        values, units = values.numpy(), units.numpy()
        prev = _previous(units) if dedup else np.full(units.shape[0], -1, dtype=np.int64)
        counted = prev < 0
        threshold = threshold_of(watermark.spec)
        per_position = values.sum(axis=1).astype(np.float64) if values.ndim == 2 else values.astype(np.float64)
    else:
        flags, prev = score_positions(watermark, ids, None, dedup)
        counted = counted_positions(prev)
        threshold = threshold_of(watermark.spec)
        units = None
        per_position = flags.astype(np.float64)
    first = total_tokens - per_position.shape[0]  # tokens before the first scored position (h; 0 for vllm:gumbel)
    if common is None or threshold is None:
        hits = np.cumsum(per_position * counted)
        scored = np.cumsum(counted)
    else:  # prefix of L tokens (positions < L - h): a unit counts where its frequency is below L's threshold
        freq = common.frequency_of(watermark.unit_identities(ids) if units is None
                                   else unit_identities("lefthash", units, None))  # sampling units: (h, token)
        lengths = np.arange(first + 1, total_tokens + 1)
        limits = np.array([threshold_for_length(threshold, int(n), common.window_tokens) for n in lengths])
        within = np.arange(freq.shape[0])[None, :] < (lengths - first)[:, None]
        kept = within & counted[None, :] & (freq[None, :] < limits[:, None])
        hits = (kept * per_position[None, :]).sum(axis=1)
        scored = kept.sum(axis=1)
    if not is_sampling(watermark.spec):
        p[first + 1:] = binomial_sf(np.rint(hits).astype(np.int64), scored, watermark.gamma)
        if margins is not None:  # the verdict's promise (detector.promise.promised_p_value), without the key's guard
            gamma = watermark.gamma
            z = (hits - gamma * scored) / np.sqrt(np.maximum(scored, 1) * gamma * (1 - gamma))
            held = np.where(scored > 0, special.ndtr(-(z - margins[first + 1:])), 1.0)
            p[first + 1:] = np.maximum(p[first + 1:], held)
    else:  # the family's own tail: Gamma (Gumbel races) or binomial (tournaments)
        p[first + 1:] = family.window_p_values(watermark, hits, scored)
    return p
