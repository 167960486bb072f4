"""What a scored position's unit IS, named without the key: the tokens that decide its green flag.

A position's flag is one coin of the key. Which tokens that coin belongs to depends on the scheme:

* unigram:            the token itself                                     ("tok", v)
* lefthash h:         the (h+1)-gram, context then token                    ("gram", c_1..c_h, v)
* minhash h:          the context token with the smallest keyed value, and the token   ("pair", c*, v)
* selfhash h:         the same, where the token itself may win the min      ("pair", c*, v) or ("tok", v)

The seed of minhash and selfhash depends on WHICH token anchors, not on how far back it stands, so
the pair carries no distance: "the" anywhere in the window before "of" is one coin.

For minhash and selfhash WHICH context token anchors the seed is chosen by the key, but once it is
known the identity is key-free: it is what the same human text shares with other human texts,
whatever the key. ``identities`` maps each identity to 64 bits (tokens and pairs: one SplitMix64
round over tag and ids packed into 64 bits, a bijection; n-grams: a SplitMix64 chain), so a table of
identities frequent in human text (``detector.common_units``) can be looked up with a few vectorised
gathers. ``window_identities`` lists every identity a stretch of text contains, for building such a
table.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

TOKEN_TAG, PAIR_TAG, GRAM_TAG = 1, 2, 3
PAIR_WINDOW = 4  # a table counts a pair (a, v) when a stands at most this far before v (the default h)
MAX_GRAM = 5  # (h+1)-grams up to h = 4 are named; longer contexts are rarely shared by human texts

_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
UNNAMED = np.uint64(0)  # identity of a position no table can name (never a table entry)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z ^= z >> _S30  # in place: a third fewer temporaries on the per-text path
        z *= _M1
        z ^= z >> _S27
        z *= _M2
        z ^= z >> _S31
    return z


def hash_identity(tag: int, columns: list[np.ndarray]) -> np.ndarray:
    """SplitMix64 chain over ``tag`` then each column (token ids), per row; never 0."""
    return _chain(_splitmix(np.full(columns[0].shape, tag, dtype=np.uint64)), columns)


def _chain(acc: np.ndarray, columns: list[np.ndarray]) -> np.ndarray:
    """``hash_identity``'s chain from ``acc`` (one value for every row broadcasts) over ``columns``."""
    for column in columns:
        acc = _splitmix(acc ^ column.astype(np.uint64))
    acc[acc == UNNAMED] = np.uint64(1)
    return acc


def _packed(tag: int, high: np.ndarray | int, low: np.ndarray) -> np.ndarray:
    """One SplitMix64 round over tag (2 bits), high and low token ids (31 bits each) packed in 64 bits:
    distinct inputs give distinct identities (the round is a bijection); never 0."""
    packed = (np.uint64(tag) << np.uint64(62)) | (np.asarray(high, dtype=np.uint64) << np.uint64(31)) \
        | low.astype(np.uint64)
    out = _splitmix(packed)
    out[out == UNNAMED] = np.uint64(1)
    return out


def token_identities(tokens: np.ndarray) -> np.ndarray:
    return _packed(TOKEN_TAG, 0, tokens)


def pair_identities(anchors: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return _packed(PAIR_TAG, anchors, tokens)


def gram_identities(grams: np.ndarray) -> np.ndarray:
    """[N, n] n-grams (n >= 2)."""
    n = grams.shape[1]
    return _chain(_gram_start(n), [grams[:, j] for j in range(n)])


@functools.cache
def _gram_start(n: int) -> np.ndarray:
    """The chain's first two rounds (GRAM_TAG, then n): the same for every row, computed once as one value."""
    start = _splitmix(_splitmix(np.full(1, GRAM_TAG, dtype=np.uint64)) ^ np.uint64(n))
    start.flags.writeable = False  # shared by every call
    return start


def identities(scheme: str, ngrams: np.ndarray, anchor_index: np.ndarray | None) -> np.ndarray:
    """Identity of each scored position. ``ngrams`` [T, h+1] is context then token; ``anchor_index``
    [T] (minhash, selfhash) the column of the anchoring token, h when the token anchors itself."""
    tokens = ngrams[:, -1]
    h = ngrams.shape[1] - 1
    if scheme == "unigram":
        return token_identities(tokens)
    if scheme == "lefthash":
        if h + 1 > MAX_GRAM:
            return np.full(tokens.shape[0], UNNAMED, dtype=np.uint64)
        return gram_identities(ngrams)
    if anchor_index is None:
        raise ValueError(f"{scheme}: the anchor of each position is needed")
    out = token_identities(tokens)  # the token anchors itself (selfhash)
    rows = np.flatnonzero(anchor_index < h)
    out[rows] = pair_identities(ngrams[rows, anchor_index[rows]], tokens[rows])
    return out


def window_identities(ids: np.ndarray) -> dict[int, np.ndarray]:
    """Every identity any scheme could give a position of ``ids``, once each, by kind (TOKEN_TAG,
    PAIR_TAG, GRAM_TAG): the raw counts of a table of units frequent in human text."""
    n = ids.shape[0]
    pairs = [pair_identities(ids[:n - d], ids[d:]) for d in range(1, min(PAIR_WINDOW, n - 1) + 1)]
    grams = [gram_identities(np.lib.stride_tricks.sliding_window_view(ids, size)) for size in range(2, min(MAX_GRAM, n) + 1)]
    empty = np.zeros(0, dtype=np.uint64)
    return {TOKEN_TAG: np.unique(token_identities(ids)),
            PAIR_TAG: np.unique(np.concatenate(pairs)) if pairs else empty,
            GRAM_TAG: np.unique(np.concatenate(grams)) if grams else empty}


def anchor_values(scheme: str, token_values: torch.Tensor, salt: torch.Tensor | None, own: torch.Tensor | None,
                  ngrams: torch.Tensor) -> torch.Tensor:
    """[T, h] (minhash) or [T, h + 1] (selfhash) keyed values whose min is each position's seed and whose
    argmin is the column of its anchor (h = the token itself).

    ``token_values`` [V] are the key's single-token PRF values; for selfhash ``salt``/``own`` [V]
    (the same values ``watermark.seeding.selfhash_seeds`` takes the min of)."""
    h = ngrams.shape[1] - 1
    values = token_values[ngrams[:, :h]]
    if scheme == "selfhash":
        tokens = ngrams[:, h]
        values = torch.cat([values ^ salt[tokens].unsqueeze(1), own[tokens].unsqueeze(1)], dim=1)
    return values
