"""A text's meaning and words as 512 signed bytes: what the semantic memory keeps of an output (``db.semantic_memory``).

A paraphrase replaces the tokens a watermark and the 5-gram match (``db.output_grams``) read, and keeps what
the text says and many of its content words. So the generation service also keeps, per output, a passage vector
of two parts, each unit length, added with weights ``1 - LEXICAL_WEIGHT`` and ``LEXICAL_WEIGHT`` (their squares'
roots) and made unit length again, so that the cosine of two vectors is about the same mix of the parts' cosines:

* meaning (MEANING_DIM coordinates): WordLlama's 256-d static token embeddings (``wordllama``; its model ships
  inside the wheel and is loaded from the installed files, never downloaded): each token of the service's own
  vocabulary gets the WordLlama embedding of its text (``vocab_table``), and a text's part is the mean over the
  token ids the detector already read it as, in a space fitted on human text (``passage_space``: centred, the
  directions along which texts vary whatever they say taken out, then its MEANING_DIM main directions kept);
* words (WORDS_DIM coordinates): the text's words, lower-cased and cut to their first STEM_CHARS characters (a
  crude stemmer: "announced" and "announces" are one stem), weighted as TF-IDF (1 + log count, at most 3 counted
  per stem, times the stem's inverse document frequency on human text and on the model's own outputs, fitted
  with the space, so the words every output uses weigh little), hashed into the coordinates by a public count
  sketch (``SKETCH_BUCKETS`` signed coordinates per stem, drawn from a keyed hash of the stem under the public
  ``SKETCH_KEY``): the cosine of two sketches is close to the cosine of their TF-IDF vectors. Words, not tokens:
  outputs in one script share its byte-level tokens whatever they say, and one stem covers a word's inflections.

Both services compute it the same way, from the token ids (the words part from their decoded text), so a detector
worker compares a pasted text's vector with the ones the generation workers stored. What is stored is that vector
turned by a keyed rotation (an orthogonal DIM x DIM matrix drawn from a seed the keyring's master key derives,
``VECTOR_PURPOSE``) and quantised to int8 with one scale per vector (``quantised``). A rotation keeps every
cosine, so matching loses nothing; without the master key the stored bytes are not in WordLlama's space nor in
the sketch's, so reading a text's words back from them needs the key as well (docs/security.md, "What the
semantic memory stores"). ``FORM`` numbers this recipe: rows stored under another form are not compared with it.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from db.passage_words import Words, stem_frequencies, words_part

EMBEDDING_DIM = 256  # WordLlama's shipped model (l2_supercat_256)
MEANING_DIM = 128  # the meaning part's coordinates: the fitted space's main directions
WORDS_DIM = 384  # the words part's coordinates (db.passage_words)
DIM = MEANING_DIM + WORDS_DIM  # what is stored per output (int8)
VECTOR_PURPOSE = b"provmark/semantic-memory-rotation"  # the master-key derivation label of the rotation's seed
MODEL_FILES = ("weights/l2_supercat_256.safetensors", "tokenizers/l2_supercat_tokenizer_config.json")
SPACE_FILE = Path(__file__).with_name("data") / "passage_space.npz"
SPACE_DIRECTIONS = 8  # directions of most variance taken out (all-but-the-top)
# the stored vector's recipe. 1: the meaning part alone; 2: with a words part of token counts in 256 coordinates;
# 3: word stems (not tokens) weighted on human text and the model's outputs, 384 + 128 coordinates
FORM = 3
# the words part's share of a cosine: on whole-text paraphrases the meaning part alone recognised far fewer
# (docs/detection.md; ``python -m evaluation.paraphrase_calibration --lexical-weight W`` compares shares)
LEXICAL_WEIGHT = 0.8
_LOCK = threading.Lock()
_BUILDING = threading.Lock()
log = logging.getLogger(__name__)


class EmbedderUnavailable(RuntimeError):
    """``wordllama`` is not installed, or its shipped model files are missing."""


@functools.cache
def embedder() -> tuple:
    """WordLlama's 256-d model as (its tokenizer, its token embeddings [vocabulary, EMBEDDING_DIM] float32), loaded once per
    process from the installed wheel's own files (no download: wordllama's own loader looks for the tokenizer in
    a folder the wheel does not have, then goes to the network)."""
    try:
        import wordllama  # noqa: PLC0415 (16 MB of weights: loaded by the first service that embeds)
        from safetensors import safe_open  # noqa: PLC0415 (with it)
        from tokenizers import Tokenizer  # noqa: PLC0415 (with it)
    except ImportError as exc:
        raise EmbedderUnavailable(f"the semantic memory needs wordllama: {exc}") from None
    root = Path(wordllama.__file__).parent
    weights, tokenizer = (root / name for name in MODEL_FILES)
    if not weights.is_file() or not tokenizer.is_file():
        raise EmbedderUnavailable(f"wordllama's shipped model files are missing under {root}")
    with safe_open(str(weights), framework="np", device="cpu") as f:
        table = np.ascontiguousarray(f.get_tensor("embedding.weight"), dtype=np.float32)
    if table.shape[1] != EMBEDDING_DIM:
        raise EmbedderUnavailable(f"wordllama's model has {table.shape[1]} dimensions, expected {EMBEDDING_DIM}")
    words = Tokenizer.from_file(str(tokenizer))
    words.no_padding()
    words.no_truncation()
    return words, table


def unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)


@dataclass(frozen=True)
class Space:
    """What a text's vector is computed from, per vocabulary (``vocab_table``): the meaning part's token table
    [V, MEANING_DIM] and offset [MEANING_DIM], the vocabulary's decoder (token ids to text) and the fitted word
    stems (``db.passage_words.Words``)."""

    table: np.ndarray
    offset: np.ndarray
    decode: Callable[[list[int]], str]
    words: Words


_TABLES: dict[str, Space] = {}


def vocab_table(vocab) -> Space:
    """``vocab``'s ``Space``, made once per process and vocabulary (seconds): per token the WordLlama embedding of
    its text, less the offset, in the space texts are compared in, so a text's meaning part is a mean over the
    token ids the detector has already read it as (``ids_vector``), no second tokenizer per verdict. That space
    (``SPACE_FILE``, fitted by ``python -m evaluation.paraphrase_calibration`` for the embedded tokenizer) takes
    out the mean text and the SPACE_DIRECTIONS directions along which human texts vary most whatever they say
    (function words, markup), keeps the MEANING_DIM directions along which they vary most after that, and holds
    the word stems' inverse document frequencies (``fitted_words``, for every vocabulary). A vocabulary the space
    was not fitted for has its meaning part compared uncentred, on MEANING_DIM fixed random directions."""
    found = _TABLES.get(vocab.fingerprint)
    if found is not None:
        return found
    with _BUILDING:  # one build per process: a request during the warm-up waits for it
        found = _TABLES.get(vocab.fingerprint)
        return found if found is not None else _build_table(vocab)


def _build_table(vocab) -> Space:
    out = token_embeddings(vocab)
    offset = np.zeros(EMBEDDING_DIM, dtype=np.float32)
    space = passage_space(vocab.fingerprint)
    if space is not None:
        mean, directions, projection = space
        out -= (out @ directions.T) @ directions  # a linear map: the mean of mapped rows is the mapped mean
        offset = mean - (mean @ directions.T) @ directions
    else:
        projection = np.linalg.qr(np.random.default_rng(0).standard_normal((EMBEDDING_DIM, MEANING_DIM)))[0].T
    built = Space(np.ascontiguousarray(out @ projection.T, dtype=np.float32),
                  (offset @ projection.T).astype(np.float32), _decoder(vocab), fitted_words())
    with _LOCK:
        _TABLES[vocab.fingerprint] = built
    return built


def _decoder(vocab) -> Callable[[list[int]], str]:
    """Token ids to text, special tokens left out (the Rust tokenizer's own decoder where there is one)."""
    backend = getattr(vocab.tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(vocab.tokenizer.decode, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def warm_up(vocab) -> None:
    """Make ``vocab``'s table now (about 2.5 s on 2 cores, once per process), at start-up rather than on a
    request. In the calling thread on purpose: the detector's gunicorn master makes its app before it forks the
    workers, which then share the table; a thread still building at the fork would leave the workers a held lock.
    A missing embedder is said once, in the log."""
    try:
        vocab_table(vocab)
    except EmbedderUnavailable as error:
        log.warning("the semantic memory is unavailable: %s", error)


def token_embeddings(vocab) -> np.ndarray:
    """Per token of ``vocab``, the WordLlama embedding of its text (the mean of its WordLlama tokens')
    [V, EMBEDDING_DIM]."""
    words, table = embedder()
    pieces = vocab.tokenizer.batch_decode([[i] for i in range(vocab.vocab_size)], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
    out = np.zeros((vocab.vocab_size, EMBEDDING_DIM), dtype=np.float32)
    for i, encoding in enumerate(words.encode_batch(pieces, add_special_tokens=False)):
        if encoding.ids:
            out[i] = table[np.minimum(encoding.ids, table.shape[0] - 1)].mean(axis=0)
    return out


def fit_space(fingerprint: str, text_means: np.ndarray, stem_documents, path: Path = SPACE_FILE) -> None:
    """Write ``passage_space``'s file for one vocabulary from human texts' mean token embeddings [n, EMBEDDING_DIM]
    (their mean, their SPACE_DIRECTIONS top principal directions, then the MEANING_DIM top principal directions
    of their unit meaning parts) and the word stems of the documents the inverse document frequencies are fitted
    on (each a list, ``db.passage_words.stems``: human text and the model's outputs); the process's tables are
    made again."""
    mean = text_means.mean(axis=0)
    centred = text_means - mean
    directions = np.linalg.svd(centred, full_matrices=False)[2][:SPACE_DIRECTIONS]
    parts = unit(centred - (centred @ directions.T) @ directions)
    projection = np.linalg.svd(parts - parts.mean(axis=0), full_matrices=False)[2][:MEANING_DIM]
    fitted_stems, idf, unseen = stem_frequencies(stem_documents)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, fingerprint=np.asarray(fingerprint), mean=mean.astype(np.float32),
                        directions=directions.astype(np.float32), projection=projection.astype(np.float32),
                        stems=fitted_stems, stem_idf=idf.astype(np.float16), unseen_idf=np.float32(unseen))
    with _LOCK:
        _TABLES.clear()


def passage_space(fingerprint: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The meaning part's space for the vocabulary with ``fingerprint``: (the mean text vector [EMBEDDING_DIM], the
    top directions taken out [SPACE_DIRECTIONS, EMBEDDING_DIM], the directions kept [MEANING_DIM,
    EMBEDDING_DIM]); None when ``SPACE_FILE`` holds none for it (or one of an earlier form)."""
    if not SPACE_FILE.is_file():
        return None
    with np.load(SPACE_FILE) as data:
        if str(data["fingerprint"]) != fingerprint or "projection" not in data:
            return None
        return (data["mean"].astype(np.float32), data["directions"].astype(np.float32),
                data["projection"].astype(np.float32))


def fitted_words() -> Words:
    """The word stems fitted with the space (``SPACE_FILE``), for every vocabulary (a stem is read from the
    decoded text, whatever tokens it came from); none, every stem weighing alike, without the file."""
    if SPACE_FILE.is_file():
        with np.load(SPACE_FILE) as data:
            if "stems" in data:
                return Words.fitted(data["stems"].tolist(), data["stem_idf"].astype(np.float32),
                                    float(data["unseen_idf"]), WORDS_DIM)
    return Words({}, np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.float32), 1.0,
                 np.zeros(0, dtype=np.float32))


def ids_vector(token_ids, space: Space) -> np.ndarray:
    """A text's unit-length vector [DIM] float32 from its token ids: the meaning part (one gather of each distinct
    token's row) and the words part (``db.passage_words``, from the ids' text), each unit length, mixed."""
    ids = np.asarray(token_ids, dtype=np.int64)
    ids = ids[(ids >= 0) & (ids < space.table.shape[0])]
    if not ids.shape[0]:
        return np.zeros(DIM, dtype=np.float32)
    tokens, counts = np.unique(ids, return_counts=True)
    # the mean's direction, scaled
    meaning = counts.astype(np.float32) @ space.table[tokens] - space.offset * float(ids.shape[0])
    words = words_part(space.decode(ids.tolist()), space.words, WORDS_DIM)
    mixed = np.zeros(DIM, dtype=np.float32)
    for part, share, at in ((meaning, 1.0 - LEXICAL_WEIGHT, slice(0, MEANING_DIM)),
                            (words, LEXICAL_WEIGHT, slice(MEANING_DIM, DIM))):
        norm = float(np.linalg.norm(part))
        if norm > 0:
            mixed[at] = (np.sqrt(share) / norm) * part
    return unit(mixed)


def rotation_seed(keyring) -> bytes:
    """The rotation's 32-byte seed, derived from ``keyring``'s master key (the same in every worker)."""
    return keyring.derive_key(VECTOR_PURPOSE)


@functools.lru_cache(maxsize=4)
def rotation(seed: bytes) -> np.ndarray:
    """The orthogonal DIM x DIM matrix of ``seed`` (QR of a seeded Gaussian, signs fixed: one matrix per seed)."""
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed[:32], "little")))
    q, r = np.linalg.qr(rng.standard_normal((DIM, DIM)))
    return np.ascontiguousarray((q * np.sign(np.diag(r))).astype(np.float32))


def quantised(vectors: np.ndarray) -> np.ndarray:
    """int8 [n, DIM]: each row scaled so its largest coordinate is +-127, rounded (the cosine of two quantised
    vectors is within about 0.001 of the float one's; a zero row stays zero)."""
    vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    peak = np.abs(vectors).max(axis=1, keepdims=True)
    scaled = np.divide(vectors * 127.0, peak, out=np.zeros_like(vectors), where=peak > 0)
    return np.clip(np.rint(scaled), -127, 127).astype(np.int8)


def stored_vector(token_ids, space: Space, seed: bytes) -> np.ndarray:
    """What the memory stores and looks up for one text's token ids: int8 [DIM], ``stored_form`` of its
    ``ids_vector``."""
    vector = ids_vector(token_ids, space)
    if not vector.any():
        return np.zeros(DIM, dtype=np.int8)
    return quantised(vector @ rotation(seed))[0]


def stored_form(vectors: np.ndarray, seed: bytes) -> np.ndarray:
    """What the memory stores and looks up for unit embeddings [n, DIM] or [DIM]: rotated, quantised (int8)."""
    return quantised(np.asarray(vectors, dtype=np.float32) @ rotation(seed))
