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
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from evaluation.oracle_attack import balanced_accuracy
from watermark.units import identities

BASE_CHUNK = 32  # sequences per base-model call (their logits are held until reduced to the top k)
TOP_K = 32  # base-model tokens per position kept for the expected counts (the rest carry little mass)
PSEUDO_COUNT = 0.5  # A: shrinks the log-ratio of rarely seen pairs towards 0 (no opinion)
MIN_SUPPORT = 0.5  # seen + expected below this: the pair says nothing


class _Saved:
    """``save`` / ``load`` of a slots dataclass of arrays as one .npz (``_INTS`` and ``_BOOLS`` fields come back
    as Python scalars)."""

    __slots__ = ()
    _INTS: tuple[str, ...] = ()
    _BOOLS: tuple[str, ...] = ()

    def save(self, path) -> None:
        np.savez_compressed(path, **{name: getattr(self, name) for name in self.__slots__})

    @classmethod
    def load(cls, path):
        with np.load(path) as found:
            values = {name: found[name] for name in cls.__slots__}
        values.update({name: int(values[name]) for name in cls._INTS})
        values.update({name: bool(values[name]) for name in cls._BOOLS})
        return cls(**values)


@dataclass(slots=True)
class StolenCounts(_Saved):
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
    _INTS = ("vocab_size", "window", "tokens")
    _BOOLS = ("self_anchor",)


def pair_log_ratio(seen: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return np.log((seen + PSEUDO_COUNT) / (expected + PSEUDO_COUNT))


def _supported(keys: np.ndarray, seen: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The keys with some support (seen + expected >= MIN_SUPPORT) and their scores."""
    support = seen + expected >= MIN_SUPPORT
    return keys[support], pair_log_ratio(seen[support], expected[support])


def _scored(texts, window: int):
    """(ids as int64, the positions after the first ``window``, top-k ids, top-k probs) of each text long enough."""
    for ids, top_ids, top_probs in texts:
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size > window:
            yield ids, np.arange(window, ids.size), top_ids, top_probs


def accumulate(texts: list[tuple[list[int], np.ndarray, np.ndarray]], vocab_size: int, window: int,
               self_anchor: bool) -> StolenCounts:
    """Counts from ``(token ids, top-k ids [T, K], top-k probs [T, K])`` per text, where row i is the base
    model's distribution of token i given everything before it; the first ``window`` tokens pair with nothing."""
    keys, weights, seen_keys = [], [], []
    token_seen = np.zeros(vocab_size)
    token_expected = np.zeros(vocab_size)
    total = 0
    for ids, at, top_ids, top_probs in _scored(texts, window):
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


def save_rows(path, rows: list[tuple[list[int], np.ndarray, np.ndarray]]) -> None:
    """``base_topk``'s rows with their token ids, one file (written whole, then renamed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, lengths=np.array([len(r[0]) for r in rows], dtype=np.int64),
             ids=np.concatenate([np.asarray(r[0], dtype=np.int64) for r in rows]),
             top_ids=np.concatenate([r[1] for r in rows]), top_probs=np.concatenate([r[2] for r in rows]))
    tmp.replace(path)


def load_rows(path) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    with np.load(path) as found:
        bounds = np.cumsum(found["lengths"])[:-1]
        parts = [np.split(found[name], bounds) for name in ("ids", "top_ids", "top_probs")]
    return [(ids.tolist(), top_ids, top_probs) for ids, top_ids, top_probs in zip(*parts)]


class ColourEstimate:
    """The attacker's colour table: ``unit_scores(ngrams)`` and ``row_scores(context)`` (a dense [V] score)."""

    def __init__(self, counts: StolenCounts) -> None:
        self.counts = counts
        self.vocab_size = counts.vocab_size
        self.window = counts.window
        self.keys, self.scores = _supported(counts.pair_keys, counts.pair_seen, counts.pair_expected)
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


    def digest_material(self) -> bytes:
        """What the table's steered generations depend on (their cache key)."""
        return self.keys.tobytes() + self.scores.tobytes() + self.token_scores.tobytes()


# ---------------------------------------------------------------------------------------------------------
# Counting per unit: the unit named by the key (known-units, an upper bound: no attack) or by a thief's
# learned anchors (learned-anchors).

ESTIMATORS = ("pairs", "learned-anchors", "known-units")


@dataclass(slots=True)
class UnitCounts(_Saved):
    """Per unit identity (``watermark.units``): occurrences in the watermarked text and the base model's
    expected occurrences at the same positions, each candidate filed under the unit IT would form there."""

    units: np.ndarray  # uint64, sorted
    seen: np.ndarray  # float64
    expected: np.ndarray  # float64
    tokens: int = 0
    _INTS = ("tokens",)


def accumulate_units(texts: list[tuple[list[int], np.ndarray, np.ndarray]], mark) -> UnitCounts:
    """``accumulate``'s counts for a thief who knows each (context, token)'s unit under ``mark``'s key: for
    minhash and selfhash, which context token anchors (the real attack has to guess it: ``accumulate``
    spreads every position over all its context tokens). Same input: ``(ids, top-k ids, top-k probs)``."""
    h = mark.context_width
    seen_units, expected_units, weights = [], [], []
    total = 0
    for ids, at, top_ids, top_probs in _scored(texts, h):
        total += at.size
        contexts = np.lib.stride_tricks.sliding_window_view(ids, h)[:-1][at - h] if h else np.zeros((at.size, 0), np.int64)
        seen_units.append(mark.ngram_identities(np.column_stack([contexts, ids[at]])))
        candidates = top_ids[at]
        k = candidates.shape[1]
        rows = np.column_stack([np.repeat(contexts, k, axis=0), candidates.reshape(-1)])
        expected_units.append(mark.ngram_identities(rows))
        weights.append(top_probs[at].reshape(-1))
    every = np.concatenate(seen_units + expected_units) if seen_units else np.zeros(0, dtype=np.uint64)
    units, inverse = np.unique(every, return_inverse=True)
    observed = sum(u.size for u in seen_units)
    seen = np.bincount(inverse[:observed], minlength=units.size).astype(np.float64)
    expected = np.bincount(inverse[observed:], weights=np.concatenate(weights) if weights else None,
                           minlength=units.size)
    return UnitCounts(units, seen, expected, total)


class KnownUnitEstimate:
    """The colour table of a thief told every unit (``accumulate_units``), with ``ColourEstimate``'s
    interface. An UPPER BOUND on any estimator that learns the anchors from text, not a real attack: it
    asks the key which context token anchors each (context, candidate). For unigram and lefthash h <= 4 the
    unit is key-free, so it is the real attack there."""

    def __init__(self, counts: UnitCounts, mark) -> None:
        self.counts = counts
        self.mark = mark
        self.vocab_size = mark.vocab_size
        self.window = mark.context_width
        self.keys, self.scores = _supported(counts.units, counts.seen, counts.expected)
        self._all = torch.arange(self.vocab_size, dtype=torch.int64)[:, None]

    def _lookup(self, named: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not len(self.keys):
            return np.zeros(named.shape[0]), np.zeros(named.shape[0], dtype=bool)
        at = np.clip(np.searchsorted(self.keys, named), 0, len(self.keys) - 1)
        known = self.keys[at] == named
        return np.where(known, self.scores[at], 0.0), known

    def unit_scores(self, ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ngrams = np.asarray(ngrams, dtype=np.int64)
        return self._lookup(self.mark.ngram_identities(ngrams[:, -(self.window + 1):]))

    def row_scores(self, context: list[int]) -> tuple[np.ndarray, np.ndarray]:
        last = torch.as_tensor(list(context[len(context) - self.window:]), dtype=torch.int64)
        rows = torch.cat([last.expand(self.vocab_size, self.window), self._all], dim=1)
        return self._lookup(self.mark.ngram_identities(rows))

    def digest_material(self) -> bytes:
        """The table and who names its units (the key, or learned anchors): a row's scores depend on both."""
        namer = type(self.mark).__name__.encode()
        if isinstance(self.mark, LearnedAnchors):
            namer += self.mark.prefix.tobytes() + self.mark.known.tobytes()
        return b"units:" + namer + self.keys.tobytes() + self.scores.tobytes()


# ---------------------------------------------------------------------------------------------------------
# A context-aware thief for selfhash: learn which context token anchors, then count per learned unit.

ANCHOR_BITS = 6  # leading bits of each token's keyed value the thief tries to learn
ANCHOR_MIN_EXPECTED = 20.0  # base-model expectation each half of a split needs before a bit is decided
_SIGN = np.uint64(1 << 63)


class LearnedAnchors:
    """A selfhash thief's guess of which context token anchors each (context, candidate), learned from the
    pair counts (``accumulate``) alone: what ``KnownUnitEstimate`` is told, estimated.

    Selfhash's anchor is the argmin over the context tokens and the candidate t of T[x] XOR salt[t] (signed):
    T is keyed, the salt is public. x anchors most often for the candidates whose salt agrees with T[x] in the
    leading bits, and where it anchors, its pairs (x, t) carry one colour each, so their counts deviate from
    the base model's more than where another token anchors. So bit by bit, among the candidates that agree
    with the bits learned so far, the thief splits x's pairs by the next salt bit and keeps the half whose
    counts deviate more per expected occurrence (squared pair score weighted by the expected count): that
    bit of T[x] is learned, up to
    ``ANCHOR_BITS``, while each half has ``ANCHOR_MIN_EXPECTED``. A position's anchor is then the token with
    the smallest learned prefix XOR the candidate's salt (unknown bits: the middle of what is left).

    Duck-types the part of a ``Watermark`` that ``accumulate_units`` and ``KnownUnitEstimate`` use."""

    def __init__(self, counts: StolenCounts, salt: np.ndarray, bits: int = ANCHOR_BITS) -> None:
        V = counts.vocab_size
        self.vocab_size, self.context_width = V, counts.window
        self.order_salt = np.asarray(salt).astype(np.int64).view(np.uint64) ^ _SIGN  # T XOR this, unsigned = order
        self.prefix = np.zeros(V, dtype=np.uint64)  # learned leading bits of T[x], left-aligned
        self.known = np.zeros(V, dtype=np.int64)  # how many
        keys, seen, expected = counts.pair_keys, counts.pair_seen, counts.pair_expected
        starts = np.searchsorted(keys, np.arange(V + 1, dtype=np.int64) * V)
        # a pair's deviation: its score squared, weighted by its expected count (the many rarely expected pairs
        # are noise: an unweighted Poisson deviance decided the leading bit of only the 20 most frequent tokens
        # better than a coin at 3e5 stolen tokens; this one 0.9 of them, 0.86 of the next 80)
        deviance = expected * pair_log_ratio(seen, expected) ** 2
        for x in np.flatnonzero(np.diff(starts) > 0):
            a, b = starts[x], starts[x + 1]
            if expected[a:b].sum() < 2 * ANCHOR_MIN_EXPECTED:
                continue
            salts = self.order_salt[keys[a:b] - x * V]
            dev, exp = deviance[a:b], expected[a:b]
            keep = np.ones(b - a, dtype=bool)
            prefix = np.uint64(0)
            for j in range(bits):
                bit = ((salts >> np.uint64(63 - j)) & np.uint64(1)).astype(bool)
                halves = [keep & ~bit, keep & bit]
                e = [exp[h].sum() for h in halves]
                if min(e) < ANCHOR_MIN_EXPECTED:
                    break
                pick = int(dev[halves[1]].sum() / e[1] > dev[halves[0]].sum() / e[0])
                prefix |= np.uint64(pick) << np.uint64(63 - j)
                keep = halves[pick]
                self.known[x] = j + 1
            self.prefix[x] = prefix

    def _order(self, tokens: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Estimated position of T[x] XOR salt[t] in [0, 1): the learned bits exact, the rest at their middle."""
        k = self.known[tokens]
        mixed = self.prefix[tokens] ^ self.order_salt[candidates]
        keep = np.where(k > 0, ~np.uint64(0) << (64 - k).astype(np.uint64), np.uint64(0))
        return (mixed & keep).astype(np.float64) / 2.0 ** 64 + 0.5 * 2.0 ** (-k.astype(np.float64))

    def ngram_identities(self, ngrams) -> np.ndarray:
        ngrams = np.asarray(ngrams, dtype=np.int64)
        candidates = np.broadcast_to(ngrams[:, -1:], ngrams.shape)
        return identities("selfhash", ngrams, np.argmin(self._order(ngrams, candidates), axis=1))


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
