"""The semantic match's two stages over many texts at once, as the detector runs them one text at a time.

``detector.paraphrase_match`` takes, per text, the CANDIDATES outputs nearest in the passage vectors' index,
keeps those at the GATE or above, and decides on the highest exact similarity of their words' signatures
(``db.passage_signature``). Here the index is replaced by the exact cosines of the int8 vectors (the index's own
errors are measured apart, in ``benchmarks/semantic_memory.py``), and the signatures' cosines of every pair are
one sparse product, so the calibration (``evaluation.paraphrase_calibration``) and the recall measurements
(``evaluation.chat_outputs``) count exactly what a verdict would say.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from db.passage_signature import ids_signature, parse, stem_key
from db.passage_vectors import vocab_table

KEY = bytes(32)  # any key: a keyed hash only renames the stems, and every cosine stays the same
CHUNK = 2048  # rows of one dense block of a product


def signatures(vocab, ids: list[list[int]]):
    """Each text's parsed signature (``db.passage_signature.Parsed``) from the token ids the services read."""
    space = vocab_table(vocab)
    key = stem_key(KEY, space.words)
    return [parse(ids_signature(i, space, KEY), key) for i in ids]


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


def confirmed(vector_sims: np.ndarray, words: np.ndarray, candidates: int, gate: float) -> tuple[np.ndarray, np.ndarray]:
    """Per row (a text): the highest words similarity among its ``candidates`` highest vector similarities at
    ``gate`` or above (0 where none is), and that output's column (-1 where none). Pairs left out are marked by a
    vector similarity below -1 in ``vector_sims``."""
    k = min(candidates, vector_sims.shape[1])
    top = np.argpartition(-vector_sims, k - 1, axis=1)[:, :k]
    near = np.take_along_axis(vector_sims, top, 1)
    scored = np.where(near >= gate, np.take_along_axis(words, top, 1), -1.0)
    at = scored.argmax(axis=1)
    best = scored[np.arange(len(at)), at]
    column = np.where(best >= 0, top[np.arange(len(at)), at], -1)
    return np.maximum(best, 0.0), column
