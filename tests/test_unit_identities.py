"""Unit identities (watermark.units) against the SplitMix64 chain computed one Python integer at a time."""

import numpy as np
import pytest

from watermark.prf import splitmix64
from watermark.units import (
    GRAM_TAG,
    PAIR_TAG,
    TOKEN_TAG,
    gram_identities,
    hash_identity,
    identities,
    pair_identities,
    token_identities,
)


def chain(tag: int, values: list[int]) -> int:
    """The straightforward definition: SplitMix64 over the tag, then over each value XORed in; 0 is 1."""
    acc = splitmix64(tag)
    for value in values:
        acc = splitmix64(acc ^ value)
    return acc or 1


@pytest.mark.parametrize("n", [2, 3, 5])
def test_gram_identities_are_the_chain_over_tag_length_and_tokens(n):
    rng = np.random.default_rng(n)
    for rows in (0, 1, 300):
        grams = rng.integers(0, 49152, (rows, n))
        expected = [chain(GRAM_TAG, [n, *row]) for row in grams.tolist()]
        assert gram_identities(grams).tolist() == expected
        assert identities("lefthash", grams, None).tolist() == expected
        columns = [np.full(rows, n)] + [grams[:, j] for j in range(n)]
        assert hash_identity(GRAM_TAG, columns).tolist() == expected


def test_token_and_pair_identities_are_one_round_over_the_packed_ids():
    rng = np.random.default_rng(1)
    anchors, tokens = rng.integers(0, 2**31, 200), rng.integers(0, 2**31, 200)
    assert token_identities(tokens).tolist() == [splitmix64(TOKEN_TAG << 62 | t) or 1 for t in tokens.tolist()]
    assert pair_identities(anchors, tokens).tolist() == [
        splitmix64(PAIR_TAG << 62 | a << 31 | t) or 1 for a, t in zip(anchors.tolist(), tokens.tolist())]
