"""Watermark stealing (Jovanovic, Staab and Vechev, "Watermark Stealing in Large Language Models", ICML 2024):
estimate the colour of (context, token) units from watermarked text alone, against the public base model.

The attacker holds N watermarked tokens (texts from the generation API on prompts it chose) and the
unwatermarked base model (public). The watermark raises green tokens by ``delta`` in every context, so a
token that follows a context more often in watermarked text than the base model predicts is probably green
there. As in the paper, counts are kept per *partial* context: a pair (c, t) counts every position where
token t follows c within the last ``window`` tokens (for lefthash h = 1 that is exactly the unit; for
selfhash h = 4 the seed is anchored by ONE context token, or by t itself, so each pair carries that anchor's
colour whenever it anchors), and for selfhash the token alone stands for its self-anchored unit.

One deviation, stronger for the attacker: the base model's side is not a second sampled corpus but its
*expected* counts at the very positions observed: sum over positions i of p_base(t | prefix_i) (one
teacher-forced pass, top ``TOP_K`` tokens plus the observed one). Same expectation as the paper's base
counts, less variance, and no contexts the two corpora do not share.

Score of a pair: ``log((seen + A) / (expected + A))`` (``A`` a pseudo-count): about ``delta - log Z`` for
green and ``-log Z`` for red, ``log Z ~ delta / 2`` at gamma = 0.25, delta = 2, so 0 separates them. A unit's
score is the mean over its supported pairs (and its token, for selfhash); believed green when > 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from evaluation.oracle_attack import balanced_accuracy

BASE_CHUNK = 32  # sequences per base-model call (their logits are held until reduced to the top k)
TOP_K = 32  # base-model tokens per position kept for the expected counts (the rest carry little mass)
PSEUDO_COUNT = 0.5  # A: shrinks the log-ratio of rarely seen pairs towards 0 (no opinion)
MIN_SUPPORT = 0.5  # seen + expected below this: the pair says nothing


@dataclass(slots=True)
class StolenCounts:
    """Pair counts in watermarked text vs the base model's expectation; ``self_anchor``: token units too."""

    vocab_size: int
    window: int
    self_anchor: bool
    pair_keys: np.ndarray  # int64, sorted: context token * V + token
    pair_seen: np.ndarray  # float64: occurrences in the watermarked text
    pair_expected: np.ndarray  # float64: the base model's expected occurrences at the same positions
    token_seen: np.ndarray  # [V]
    token_expected: np.ndarray  # [V]
    tokens: int = 0  # watermarked tokens these counts come from

    def save(self, path) -> None:
        np.savez_compressed(path, **{name: getattr(self, name) for name in self.__slots__})

    @classmethod
    def load(cls, path) -> StolenCounts:
        with np.load(path) as found:
            values = {name: found[name] for name in cls.__slots__}
        for name in ("vocab_size", "window", "tokens"):
            values[name] = int(values[name])
        values["self_anchor"] = bool(values["self_anchor"])
        return cls(**values)


def pair_log_ratio(seen: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.log((seen + PSEUDO_COUNT) / (expected + PSEUDO_COUNT))


def accumulate(texts: list[tuple[list[int], np.ndarray, np.ndarray]], vocab_size: int, window: int,
               self_anchor: bool) -> StolenCounts:
    """Counts from ``(token ids, top-k ids [T, K], top-k probs [T, K])`` per text, where row i is the base
    model's distribution of token i given everything before it; the first ``window`` tokens pair with nothing."""
    keys, weights, seen_keys = [], [], []
    token_seen = np.zeros(vocab_size)
    token_expected = np.zeros(vocab_size)
    total = 0
    for ids, top_ids, top_probs in texts:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size <= window:
            continue
        at = np.arange(window, ids.size)
        tokens = ids[at]
        total += at.size
        token_seen += np.bincount(tokens, minlength=vocab_size)
        np.add.at(token_expected, top_ids[at].ravel(), top_probs[at].ravel())
        previous = []
        for back in range(1, window + 1):
            context = ids[at - back]
            # a context token repeated inside the window is one pair (one coin)
            fresh = np.ones(at.size, dtype=bool) if not previous else ~np.any(np.stack(previous) == context, axis=0)
            previous.append(context)
            base = context[fresh, None] * vocab_size
            keys.append((base + top_ids[at][fresh]).ravel())
            weights.append(top_probs[at][fresh].ravel())
            seen_keys.append(base[:, 0] + tokens[fresh])
    all_keys = np.concatenate(keys + seen_keys) if keys else np.zeros(0, dtype=np.int64)
    unique, inverse = np.unique(all_keys, return_inverse=True)
    expected_part = np.concatenate(weights) if weights else np.zeros(0)
    expected = np.bincount(inverse[: expected_part.size], weights=expected_part, minlength=unique.size)
    seen = np.bincount(inverse[expected_part.size:], minlength=unique.size).astype(np.float64)
    return StolenCounts(vocab_size, window, self_anchor, unique, seen, expected, token_seen, token_expected, total)


def base_topk(lm, sequences: list[list[int]], starts: list[int], top_k: int = TOP_K,
              progress: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sequence, the base model's top-k ids and probabilities [len - start, k] at positions start..len-1,
    with the observed token's exact probability added when it is outside the top k (its column k).

    Sequences go through the model ``BASE_CHUNK`` at a time: only their [positions, V] logits are held,
    not the whole corpus's (1e5 positions x 49,152 logits are 20 GB)."""
    out = []
    chunks = range(0, len(sequences), BASE_CHUNK)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="base-model pass", unit="chunk")
    for at in chunks:
        part, part_starts = sequences[at:at + BASE_CHUNK], starts[at:at + BASE_CHUNK]
        logits = lm.next_token_logits(part, [list(range(s, len(q))) for q, s in zip(part, part_starts)])
        for seq, start, rows in zip(part, part_starts, logits):
            probs = torch.softmax(rows.double(), dim=-1)
            top = torch.topk(probs, top_k, dim=-1)
            observed = torch.as_tensor(seq[start:], dtype=torch.long)
            inside = (top.indices == observed[:, None]).any(dim=1)
            extra = probs.gather(1, observed[:, None]).squeeze(1) * (~inside)
            ids = torch.cat([top.indices, observed[:, None]], dim=1).numpy()
            weights = torch.cat([top.values, extra[:, None]], dim=1).numpy()
            out.append((ids, weights))
    return out


class ColourEstimate:
    """The attacker's colour table: ``unit_scores(ngrams)`` and ``row_scores(context)`` (a dense [V] score)."""

    def __init__(self, counts: StolenCounts) -> None:
        self.counts = counts
        self.vocab_size = counts.vocab_size
        self.window = counts.window
        support = counts.pair_seen + counts.pair_expected >= MIN_SUPPORT
        self.keys = counts.pair_keys[support]
        self.scores = pair_log_ratio(counts.pair_seen[support], counts.pair_expected[support])
        self.row_start = np.searchsorted(self.keys, np.arange(self.vocab_size + 1, dtype=np.int64) * self.vocab_size)
        token_support = counts.token_seen + counts.token_expected >= MIN_SUPPORT
        self.token_known = token_support & counts.self_anchor
        self.token_scores = np.where(self.token_known, pair_log_ratio(counts.token_seen, counts.token_expected), 0.0)

    def unit_scores(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For [M, w + 1] (context then token) rows: the mean score of their supported pairs, and whether
        any pair was supported (False: no estimate, score 0)."""
        ngrams = np.asarray(ngrams, dtype=np.int64)
        tokens = ngrams[:, -1]
        total = np.where(self.token_known[tokens], self.token_scores[tokens], 0.0)
        count = self.token_known[tokens].astype(np.float64)
        previous = []
        for back in range(1, min(self.window, ngrams.shape[1] - 1) + 1):
            context = ngrams[:, -1 - back]
            fresh = np.ones(len(tokens), dtype=bool) if not previous else ~np.any(np.stack(previous) == context, axis=0)
            previous.append(context)
            if not len(self.keys):
                continue
            key = context * self.vocab_size + tokens
            at = np.clip(np.searchsorted(self.keys, key), 0, len(self.keys) - 1)
            hit = fresh & (self.keys[at] == key)
            total += np.where(hit, self.scores[at], 0.0)
            count += hit
        known = count > 0
        return np.where(known, total / np.maximum(count, 1), 0.0), known

    def row_scores(self, context: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Dense [V] mean pair score of every next token after ``context`` (its last ``window`` tokens) and
        whether each has an estimate."""
        total = self.token_scores.copy()
        count = self.token_known.astype(np.float64)
        for c in dict.fromkeys(context[-self.window:]):
            a, b = self.row_start[c], self.row_start[c + 1]
            tokens = self.keys[a:b] - c * self.vocab_size
            total[tokens] += self.scores[a:b]
            count[tokens] += 1
        known = count > 0
        return np.where(known, total / np.maximum(count, 1), 0.0), known


def colour_accuracy(estimate: ColourEstimate, units: np.ndarray, truth: np.ndarray) -> dict:
    """How the estimate's colours compare with the truth on ``units`` [M, w + 1] (distinct units only)."""

    units, first = np.unique(np.asarray(units, dtype=np.int64), axis=0, return_index=True)
    truth = np.asarray(truth, dtype=bool)[first]
    scores, known = estimate.unit_scores(units)
    believed = scores > 0
    out = {"units": int(len(units)), "true_green_fraction": float(truth.mean()) if len(truth) else None,
           "coverage": float(known.mean()) if len(known) else 0.0}
    if known.any():
        out["balanced_accuracy_known"] = balanced_accuracy(list(believed[known]), list(truth[known]))
        out["precision_believed_green"] = float(truth[known & believed].mean()) if (known & believed).any() else None
        out["believed_green_fraction_known"] = float(believed[known].mean())
    # unknown units count as a coin flip at the prior: guess red
    out["balanced_accuracy_all"] = balanced_accuracy(list(believed & known), list(truth))
    return out
