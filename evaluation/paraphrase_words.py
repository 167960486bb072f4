"""The semantic match over many texts at once, as the detector runs it one text at a time.

``detector.paraphrase_match`` decides, per text, on the highest exact similarity of its words' signature
(``db.passage_signature``) to any remembered output's (``db.signature_index`` computes every one of them). Here
the signatures' cosines of every pair are one sparse product, so the calibration
(``evaluation.paraphrase_calibration``) and the recall measurements (``evaluation.chat_outputs``) count exactly
what a verdict would say.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from db.passage_signature import parse, signature, stem_key
from db.passage_words import fitted_words

KEY = bytes(32)  # any key: a keyed hash only renames the stems, and every cosine stays the same
CHUNK = 2048  # rows of one dense block of a product


def signatures(vocab, ids: list[list[int]]):
    """Each text's parsed signature (``db.passage_signature.Parsed``) from the token ids the services read (their
    text, special tokens left out), with the fitted stems as they are now (``db.passage_words.fitted_words``)."""
    words = fitted_words()
    key = stem_key(KEY, words)
    texts = vocab.tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return [parse(signature(text, words, key), key) for text in texts]


def _coordinates(parsed, columns: dict[int, int]) -> tuple[list, list, list]:
    """(rows, columns, unit weights) of the signatures over hash columns (``columns`` grows with new hashes)."""
    rows, cols, values = [], [], []
    for row, one in enumerate(parsed):
        for hashed, weight in zip(one.hashes.tolist(), one.weights.tolist()):
            rows.append(row)
            cols.append(columns.setdefault(hashed, len(columns)))
            values.append(weight)
    return rows, cols, values


def word_similarities(a, b) -> np.ndarray:
    """[len(a), len(b)] float32: the signatures' cosines (``a``, ``b``: parsed signatures)."""
    columns: dict[int, int] = {}
    made = [_coordinates(side, columns) for side in (a, b)]
    left, right = (sp.csr_matrix((np.asarray(v, np.float32), (r, c)), shape=(len(side), max(1, len(columns))))
                   for (r, c, v), side in zip(made, (a, b)))
    right = right.T.tocsc()
    out = np.empty((len(a), len(b)), dtype=np.float32)
    for start in range(0, len(a), CHUNK):
        out[start:start + CHUNK] = (left[start:start + CHUNK] @ right).toarray()
    return out


def best_of(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (a text): the highest words similarity to any output (0 where none is positive) and that output's
    column (-1 where none). Pairs left out are marked by a similarity below 0 in ``words``."""
    at = words.argmax(axis=1) if words.shape[1] else np.zeros(words.shape[0], dtype=np.int64)
    best = words[np.arange(words.shape[0]), at] if words.shape[1] else np.zeros(words.shape[0], dtype=words.dtype)
    return np.maximum(best, 0.0), np.where(best > 0, at, -1)
