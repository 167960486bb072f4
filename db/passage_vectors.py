"""A text's meaning and words as 256 signed bytes: what the semantic memory keeps of an output (``db.semantic_memory``).

A paraphrase replaces the tokens a watermark and the 5-gram match (``db.output_grams``) read, and keeps what
the text says and many of its content words. So the generation service also keeps, per output, a passage vector
of two parts, each unit length, added with weights ``1 - LEXICAL_WEIGHT`` and ``LEXICAL_WEIGHT`` (their squares'
roots) and made unit length again, so that the cosine of two vectors is about the same mix of the parts' cosines:

* meaning: WordLlama's 256-d static token embeddings (``wordllama``; its model ships inside the wheel and is
  loaded from the installed files, never downloaded): each token of the service's own vocabulary gets the
  WordLlama embedding of its text (``vocab_table``), and a text's part is the mean over the token ids the
  detector already read it as, in a space fitted on human text (``passage_space``);
* words: the text's token counts weighted as TF-IDF (1 + log count, times the token's inverse document frequency
  on human text, fitted with the space), hashed into the same 256 coordinates by a public count sketch
  (``SKETCH_BUCKETS`` signed coordinates per token, drawn from ``SKETCH_SEED``): the cosine of two sketches is
  close to the cosine of their TF-IDF vectors. On whole-text paraphrases this part keeps more than the meaning
  part does (docs/detection.md).

Both services compute it the same way, so a detector worker compares a pasted text's vector with the ones the
generation workers stored. What is stored is that vector turned by a keyed rotation (an orthogonal 256 x 256
matrix drawn from a seed the keyring's master key derives, ``VECTOR_PURPOSE``) and quantised to int8 with one
scale per vector (``quantised``). A rotation keeps every cosine, so matching loses nothing; without the master
key the stored bytes are not in WordLlama's space nor in the sketch's, so reading a text's words back from them
needs the key as well (docs/security.md, "What the semantic memory stores"). ``FORM`` numbers this recipe: rows
stored under another form are not compared with it.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DIM = 256  # WordLlama's shipped model (l2_supercat_256)
VECTOR_PURPOSE = b"provmark/semantic-memory-rotation"  # the master-key derivation label of the rotation's seed
MODEL_FILES = ("weights/l2_supercat_256.safetensors", "tokenizers/l2_supercat_tokenizer_config.json")
SPACE_FILE = Path(__file__).with_name("data") / "passage_space.npz"
SPACE_DIRECTIONS = 8  # directions of most variance taken out (all-but-the-top)
FORM = 2  # the stored vector's recipe (1: the meaning part alone, before the words part was added)
# the words part's share of a cosine: on whole-text paraphrases the meaning part alone recognised far fewer
# (docs/detection.md; ``python -m evaluation.paraphrase_calibration --lexical-weight W`` compares shares)
LEXICAL_WEIGHT = 0.7
SKETCH_BUCKETS = 4  # signed coordinates per token in the words part's count sketch
SKETCH_SEED = 4  # public: the sketch needs no secret (the keyed rotation comes after it)
_LOCK = threading.Lock()
_BUILDING = threading.Lock()
log = logging.getLogger(__name__)


class EmbedderUnavailable(RuntimeError):
    """``wordllama`` is not installed, or its shipped model files are missing."""


@functools.cache
def embedder() -> tuple:
    """WordLlama's 256-d model as (its tokenizer, its token embeddings [vocabulary, DIM] float32), loaded once per
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
    if table.shape[1] != DIM:
        raise EmbedderUnavailable(f"wordllama's model has {table.shape[1]} dimensions, expected {DIM}")
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
    [V, DIM] and offset [DIM], and the words part's count sketch: each token's SKETCH_BUCKETS coordinates
    [V, B] and their signed weights [V, B] (sign / sqrt(B) times the token's inverse document frequency)."""

    table: np.ndarray
    offset: np.ndarray
    buckets: np.ndarray
    weights: np.ndarray


_TABLES: dict[str, Space] = {}


def vocab_table(vocab) -> Space:
    """``vocab``'s ``Space``, made once per process and vocabulary (seconds): per token the WordLlama embedding of
    its text, less the offset, in the space texts are compared in, so a text's meaning part is a mean over the
    token ids the detector has already read it as (``ids_vector``), no second tokenizer per verdict. That space
    (``SPACE_FILE``, fitted on human text by ``python -m evaluation.paraphrase_calibration`` for the embedded
    tokenizer) takes out the mean text and the SPACE_DIRECTIONS directions along which texts vary most whatever
    they say (function words, markup), and holds each token's inverse document frequency on the same texts. A
    vocabulary it was not fitted for is compared uncentred, every token's frequency alike."""
    found = _TABLES.get(vocab.fingerprint)
    if found is not None:
        return found
    with _BUILDING:  # one build per process: a request during the warm-up waits for it
        found = _TABLES.get(vocab.fingerprint)
        return found if found is not None else _build_table(vocab)


def _build_table(vocab) -> Space:
    out = token_embeddings(vocab)
    offset = np.zeros(DIM, dtype=np.float32)
    idf = np.ones(vocab.vocab_size, dtype=np.float32)
    space = passage_space(vocab.fingerprint)
    if space is not None:
        mean, directions, fitted_idf = space
        out -= (out @ directions.T) @ directions  # a linear map: the mean of mapped rows is the mapped mean
        offset = mean - (mean @ directions.T) @ directions
        if fitted_idf.shape == idf.shape:
            idf = fitted_idf
    buckets, signs = sketch(vocab.vocab_size)
    built = Space(np.ascontiguousarray(out), offset.astype(np.float32), buckets,
                  np.ascontiguousarray(signs * idf[:, None], dtype=np.float32))
    with _LOCK:
        _TABLES[vocab.fingerprint] = built
    return built


def sketch(vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The words part's public count sketch: per token, SKETCH_BUCKETS coordinates [V, B] int64 and their signs
    divided by sqrt(B) [V, B] float32 (drawn from SKETCH_SEED)."""
    rng = np.random.Generator(np.random.PCG64(SKETCH_SEED))
    buckets = rng.integers(0, DIM, size=(vocab_size, SKETCH_BUCKETS), dtype=np.int64)
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(vocab_size, SKETCH_BUCKETS))
    return buckets, (signs / np.sqrt(SKETCH_BUCKETS)).astype(np.float32)


def inverse_document_frequency(token_lists, vocab_size: int) -> np.ndarray:
    """Per token, log((n + 1) / (df + 1)) + 1 over ``token_lists`` (n texts, df of them holding the token)
    [V] float32: the words part's weights, fitted on human text with the space."""
    df = np.zeros(vocab_size, dtype=np.float64)
    count = 0
    for ids in token_lists:
        ids = np.asarray(ids, dtype=np.int64)
        df[np.unique(ids[(ids >= 0) & (ids < vocab_size)])] += 1
        count += 1
    return (np.log((count + 1) / (df + 1)) + 1).astype(np.float32)


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
    """Per token of ``vocab``, the WordLlama embedding of its text (the mean of its WordLlama tokens') [V, DIM]."""
    words, table = embedder()
    pieces = vocab.tokenizer.batch_decode([[i] for i in range(vocab.vocab_size)], skip_special_tokens=False,
                                          clean_up_tokenization_spaces=False)
    out = np.zeros((vocab.vocab_size, DIM), dtype=np.float32)
    for i, encoding in enumerate(words.encode_batch(pieces, add_special_tokens=False)):
        if encoding.ids:
            out[i] = table[np.minimum(encoding.ids, table.shape[0] - 1)].mean(axis=0)
    return out


def fit_space(fingerprint: str, text_means: np.ndarray, idf: np.ndarray, path: Path = SPACE_FILE) -> None:
    """Write ``passage_space``'s file for one vocabulary from texts' mean token embeddings [n, DIM] (human text):
    their mean and their SPACE_DIRECTIONS top principal directions, and the tokens' inverse document frequency
    [V] on the same texts (``inverse_document_frequency``); the process's tables are made again."""
    mean = text_means.mean(axis=0)
    directions = np.linalg.svd(text_means - mean, full_matrices=False)[2][:SPACE_DIRECTIONS]
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, fingerprint=np.asarray(fingerprint), mean=mean.astype(np.float32),
                        directions=directions.astype(np.float32), idf=np.asarray(idf, dtype=np.float16))
    with _LOCK:
        _TABLES.clear()


def passage_space(fingerprint: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(The mean text vector [DIM], the top directions [SPACE_DIRECTIONS, DIM], the tokens' inverse document
    frequency [V]) fitted for the vocabulary with ``fingerprint``; None when ``SPACE_FILE`` holds none for it."""
    if not SPACE_FILE.is_file():
        return None
    with np.load(SPACE_FILE) as data:
        if str(data["fingerprint"]) != fingerprint or "idf" not in data:
            return None
        return data["mean"].astype(np.float32), data["directions"].astype(np.float32), data["idf"].astype(np.float32)


def ids_vector(token_ids, space: Space) -> np.ndarray:
    """A text's unit-length vector [DIM] float32 from its token ids: the meaning and words parts, each unit length,
    mixed (both from the distinct tokens and their counts: one gather of each distinct token's rows)."""
    ids = np.asarray(token_ids, dtype=np.int64)
    ids = ids[(ids >= 0) & (ids < space.table.shape[0])]
    if not ids.shape[0]:
        return np.zeros(DIM, dtype=np.float32)
    tokens, counts = np.unique(ids, return_counts=True)
    counts = counts.astype(np.float32)
    meaning = counts @ space.table[tokens] - space.offset * float(ids.shape[0])  # the mean's direction, scaled
    weights = space.weights[tokens] * (1.0 + np.log(counts))[:, None]
    words = np.bincount(space.buckets[tokens].ravel(), weights=weights.ravel(), minlength=DIM).astype(np.float32)
    mixed = np.zeros(DIM, dtype=np.float32)
    for part, share in ((meaning, 1.0 - LEXICAL_WEIGHT), (words, LEXICAL_WEIGHT)):
        norm = float(np.linalg.norm(part))
        if norm > 0:
            mixed += (np.sqrt(share) / norm) * part
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
