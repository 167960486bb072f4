"""Whether a text reads as code or prose, from its tokens alone: the share of tokens that carry code punctuation or a
line's indentation (``codeish_fraction``). The detector sizes a verdict's promise by it (``detector.promise``); the
engine picks a spec's ``code_delta`` by it while a sequence is generated (``generated_as_code``).

CODE_SHARE or more of the tokens codeish is ``code`` (source code, and documentation dense with markup), less is
``prose``.
"""

from __future__ import annotations

import threading

import numpy as np

PROSE, CODE = "prose", "code"
KINDS = (PROSE, CODE)
CODE_CHARACTERS = frozenset("{}[]()<>;=_#$@\\|&*/`%^~")
CODE_SHARE = 0.06  # of a text's tokens code-like (codeish_fraction): the text is judged as code
# generation reads its own output as code from this many generated tokens on (fewer say too little: one bracket in
# the first ten tokens of prose is 10 %)
MIN_GENERATED = 16

_tables: dict[str, np.ndarray] = {}
_lock = threading.Lock()


def is_codeish(piece: str) -> bool:
    """True for a token's text that carries code punctuation or ends a line with indentation."""
    return any(c in CODE_CHARACTERS for c in piece) or ("\n" in piece and piece.endswith(("  ", "\t")))


def table_for(tokenizer, vocab_size: int, cache_key: str) -> np.ndarray:
    """Uint8 [vocab_size]: 1 for the tokens whose text ``is_codeish`` (built once per ``cache_key``, about 0.2 s)."""
    found = _tables.get(cache_key)
    if found is None:
        with _lock:
            found = _tables.get(cache_key)
            if found is None:
                backend = getattr(tokenizer, "backend_tokenizer", None)
                ids = [[i] for i in range(vocab_size)]
                pieces = (backend.decode_batch(ids, skip_special_tokens=False) if backend is not None
                          else [tokenizer.decode(i, skip_special_tokens=False) for i in ids])
                found = _tables[cache_key] = np.fromiter(map(is_codeish, pieces), dtype=np.uint8, count=len(pieces))
    return found


def codeish_table(vocab) -> np.ndarray:
    """``table_for`` a ``watermark.vocab.Vocabulary``."""
    return table_for(vocab.tokenizer, vocab.vocab_size, vocab.fingerprint)


def codeish_fraction(vocab, ids: np.ndarray) -> float:
    """The share of the token ids ``ids`` (int array) that ``codeish_table`` marks; 0 for no tokens."""
    if ids.shape[0] == 0:
        return 0.0
    return np.count_nonzero(codeish_table(vocab).take(ids, mode="clip")) / ids.shape[0]


def kind_of_fraction(fraction: float) -> str:
    return CODE if fraction >= CODE_SHARE else PROSE


def generated_as_code(codeish: int, generated: int) -> bool:
    """Whether a sequence whose ``generated`` output tokens hold ``codeish`` codeish ones reads as code so far."""
    return generated >= MIN_GENERATED and codeish >= CODE_SHARE * generated
