"""A text's word stems, and how often human text and the model's outputs use each: what a signature is made of.

A stem is a lower-cased word (``\\w+``, any script) cut to its first STEM_CHARS characters, a crude stemmer
that makes one stem of a word's inflections ("announced", "announces") at the price of a few unrelated words
sharing one ("universe", "university"). Each stem weighs 1 + log(its count in the text, at most COUNT_CAP: 1,
so a stem weighs the same however often the text uses it) times its inverse document frequency, fitted on human
text and on the model's own outputs (``stem_frequencies``, written by ``fit_stems`` to STEMS_FILE): a stem seen
in fewer than MIN_DOCUMENTS of those documents is not kept and weighs as the rarest (``Words.unseen_idf``).
Nothing here is secret: the signature's keyed hashes come after (``db.passage_signature``).

``stem_counts`` reads a text's stems and looks them up among the fitted ones in one pass in C
(``csrc/passage_words.c``, built once with the system compiler and cached like the other native kernels,
``watermark.native_build``): a verdict's signature of a 1,000-token text took about 0.25 ms in Python, most of
it a dictionary look-up per word. Words holding non-ASCII characters are read by the pattern, as ``stems``
reads them; without a compiler, or with ``PROVMARK_NATIVE=0``, ``stems`` and a dictionary give the same rows.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from watermark.native_build import address, optional_c_library

SOURCE = Path(__file__).with_name("csrc") / "passage_words.c"

STEM_CHARS = 6  # a stem is a word's first 6 characters
STEM = re.compile(r"(\w{1,%d})\w*" % STEM_CHARS)  # a word, capturing its stem
MIN_DOCUMENTS = 2  # a stem in fewer fitted documents weighs as one never seen
# a stem counts at most this often: whether a text uses a stem, not how often. Unrelated outputs of one model repeat
# the same words (a template, a degenerate loop on one word); counting them (up to 3) set the threshold at 0.345,
# counting each once at 0.2525, and whole-text rewrites were recognised 101 times in 150 instead of 78
# (docs/research/semantic-memory.md). Signatures stored with counts up to 3 read as 1.
COUNT_CAP = 1
STEMS_FILE = Path(__file__).with_name("data") / "word_stems.npz"  # python -m evaluation.paraphrase_calibration --write


# bytes of UTF-8 text: an ASCII word character lower-cased, any other ASCII byte a space, the rest (bytes of
# non-ASCII characters) kept: splitting at the spaces leaves ASCII words, and pieces holding non-ASCII characters
_ASCII_WORDS = bytes((ord(chr(b).lower()) if chr(b).isalnum() or chr(b) == "_" else 32) if b < 128 else b
                     for b in range(256))


def stems(text: str) -> list[str]:
    """The text's word stems, in order: those of ``STEM.findall(text.lower())``. ASCII words are cut out with
    ``bytes.translate`` and ``split`` (about twice as fast as the pattern); pieces with other characters go
    through the pattern. A text with a capital sigma takes the pattern whole: its lower case depends on the letters
    around it (final sigma), which a piece alone does not have."""
    if "\u03a3" in text:
        return STEM.findall(text.lower())
    out = []
    for piece in text.encode("utf-8", "surrogatepass").translate(_ASCII_WORDS).split():
        if piece.isascii():
            out.append(piece[:STEM_CHARS].decode("ascii"))
        else:
            out += STEM.findall(piece.decode("utf-8", "surrogatepass").lower())
    return out


@dataclass(frozen=True, eq=False)
class Words:
    """The fitted stems: each one's row (``index``), each row's inverse document frequency [S], and the weight of a
    stem not among them."""

    index: dict[str, int]
    idf: np.ndarray
    unseen_idf: float


@functools.cache
def _library():
    pointer, size = ctypes.c_void_p, ctypes.c_size_t
    return optional_c_library(SOURCE, ("-O2", "-shared", "-fPIC"), "passage_words", "Python", {
        "text_stem_counts": ([pointer, size, pointer, ctypes.c_uint64, ctypes.c_int, pointer, pointer, pointer,
                              pointer, pointer, pointer, size], size)})


@functools.lru_cache(maxsize=4)
def _ascii_table(words: Words) -> tuple[np.ndarray, int, int]:
    """The fitted ASCII stems as an open-addressing table for the kernel: (slots: the stem's bytes packed little
    end first in the low 48 bits, its row + 1 in the high 16, 0 empty; mask; shift), at most two thirds full.
    Rows past 16 bits are left out: the kernel calls them not fitted and ``stem_counts`` looks them up."""
    packed = {int.from_bytes(stem.encode("ascii"), "little"): row for stem, row in words.index.items()
              if stem.isascii() and 0 < len(stem) <= STEM_CHARS and row + 1 < 1 << 16}
    bits = max(4, (3 * len(packed) // 2).bit_length())
    slots = np.zeros(1 << bits, dtype=np.uint64)
    mask, shift = (1 << bits) - 1, 64 - bits
    for key, row in packed.items():
        slot = ((key * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF) >> shift
        while slots[slot]:
            slot = (slot + 1) & mask
        slots[slot] = key | (row + 1) << 48
    return slots, mask, shift


def stem_counts(text: str, words: Words, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``text``'s stems (``stems``): the fitted rows that ``kept`` (a bool per row) marks, each once (int64, in no
    particular order), how often the text has each (int64, at most 255), and the stems that are not fitted (one
    per occurrence)."""
    library = _library()
    if library is None or "\u03a3" in text:
        get = words.index.get
        counts: collections.Counter = collections.Counter()
        others = []
        for stem in stems(text):
            row = get(stem)
            if row is None:
                others.append(stem)
            elif kept[row]:
                counts[row] += 1
        return (np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)),
                np.minimum(np.fromiter(counts.values(), dtype=np.int64, count=len(counts)), 255), others)
    data = text.encode("utf-8", "surrogatepass")
    capacity = len(data) // 2 + 1
    out = np.empty(capacity, dtype=np.int32)
    starts, ends = np.empty(capacity, dtype=np.int64), np.empty(capacity, dtype=np.int64)
    found = np.empty(capacity, dtype=np.int64)
    slots, mask, shift = _ascii_table(words)
    marks = kept.view(np.uint8) if kept.dtype == np.bool_ and kept.flags.c_contiguous else np.ascontiguousarray(
        kept, dtype=np.uint8)
    seen = np.zeros(len(words.idf), dtype=np.uint8)
    count = library.text_stem_counts(data, len(data), address(slots), mask, shift, address(marks), address(seen),
                                     address(out), address(starts), address(ends), address(found), capacity)
    out, found = out[:count], found[:count]
    known = out >= 0
    if known.all():
        return out.astype(np.int64), found, []
    more: collections.Counter = collections.Counter()
    others = []
    for k in np.flatnonzero(~known).tolist():
        piece = data[starts[k]:ends[k]]
        if out[k] == -1 and len(words.idf) < 1 << 16:  # ASCII, not in the table, which holds every fitted stem
            others.append(piece[:STEM_CHARS].decode("ascii").lower())
            continue
        for stem in [piece[:STEM_CHARS].decode("ascii").lower()] if out[k] == -1 else STEM.findall(
                piece.decode("utf-8", "surrogatepass").lower()):  # past the table's rows, or non-ASCII characters
            row = words.index.get(stem)
            if row is None:
                others.append(stem)
            elif kept[row]:
                more[row] += 1
    rows, counts = out[known].astype(np.int64), found[known]
    if more:  # rows the kernel also found count together
        counts = collections.Counter(dict(zip(rows.tolist(), counts.tolist()))) + more
        rows = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        counts = np.minimum(np.fromiter(counts.values(), dtype=np.int64, count=len(counts)), 255)
    return rows, counts, others


def warm_up(words: Words) -> None:
    """Load the kernel and build ``words``' table now (about 20 ms): a server does it before it forks its workers,
    which then share both instead of each paying for them on its first verdict."""
    _library()
    _ascii_table(words)


def fitted_words(path: Path = STEMS_FILE) -> Words:
    """The stems fitted by ``fit_stems`` (shipped in STEMS_FILE); none, every stem weighing alike, without the
    file."""
    if not path.is_file():
        return Words({}, np.zeros(0, dtype=np.float32), 1.0)
    with np.load(path) as data:
        fitted = data["stems"].tolist()
        return Words({str(stem): row for row, stem in enumerate(fitted)}, data["stem_idf"].astype(np.float32),
                     float(data["unseen_idf"]))


def fit_stems(documents: Iterable[Iterable[str]], path: Path = STEMS_FILE) -> None:
    """Write STEMS_FILE from the stems of the documents the inverse document frequencies are fitted on (each a
    list, ``stems``: human text and the model's outputs)."""
    fitted, idf, unseen = stem_frequencies(documents)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, stems=fitted, stem_idf=idf.astype(np.float16), unseen_idf=np.float32(unseen))


def stem_frequencies(documents: Iterable[Iterable[str]]) -> tuple[np.ndarray, np.ndarray, float]:
    """(The stems in at least MIN_DOCUMENTS of ``documents`` (each a text's stems), sorted; their inverse
    document frequency log((n + 1) / (df + 1)) + 1 float32; that of a stem in no document)."""
    df: collections.Counter = collections.Counter()
    count = 0
    for document in documents:
        df.update(set(document))
        count += 1
    kept = sorted(stem for stem, n in df.items() if n >= MIN_DOCUMENTS)
    idf = np.array([math.log((count + 1) / (df[stem] + 1)) + 1 for stem in kept], dtype=np.float32)
    return np.array(kept, dtype=str), idf, math.log(count + 1) + 1
