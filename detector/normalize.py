"""Text normalisation before detection, with a map back to the original text's offsets.

Paraphrase-free evasion tricks change how text tokenizes while leaving it looking the same:
compatibility characters (fullwidth letters, ligatures), Cyrillic/Greek look-alikes in Latin
words, zero-width and other invisible characters, odd or doubled spaces. Each of those shifts
the token ids and so the green lists. The stages below undo them, in this order:

1. ``invisible``   remove format characters (Unicode category Cf: zero-width space/joiners, BOM,
                   soft hyphen, bidi controls, tags), control characters other than whitespace,
                   variation selectors and the invisible Hangul fillers.
2. ``nfkc``        Unicode NFKC, applied per combining sequence so offsets stay exact (a sequence longer
                   than 32 characters, which no text holds, in pieces of 32, as the stream-safe
                   format of UAX #15 cuts it).
3. ``homoglyphs``  Cyrillic/Greek letters that look like Latin ones become the Latin letter, in
                   words that also hold a Latin letter, or everywhere when the text is mostly Latin
                   (so genuine Russian or Greek text, which the model may have written, is kept).
4. ``whitespace``  line-break variants become ``\\n``; any other single space character becomes
                   ``' '``; a run of several spaces between two words becomes one space
                   (indentation at the start of a line is kept: code tokenizes on it).

Every normalised character remembers the span of original characters it came from, so token
offsets computed on the normalised text are reported in the ORIGINAL text.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from watermark.field_error import FieldError

STAGES = ("invisible", "nfkc", "homoglyphs", "whitespace")

# Look-alikes from Unicode's confusables list (security/confusables.txt) restricted to Cyrillic and
# Greek letters whose glyph is the Latin letter in common fonts.
HOMOGLYPHS = {
    # Cyrillic lowercase
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "һ": "h", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ɑ": "a",
    # Cyrillic uppercase
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "У": "Y", "Ү": "Y", "І": "I", "Ј": "J", "Ѕ": "S", "Ԛ": "Q", "Ԝ": "W",
    "Ӏ": "I",
    # Greek lowercase
    "ο": "o", "ν": "v", "ρ": "p", "α": "a", "ι": "i", "υ": "u", "κ": "k", "γ": "y",
    # Greek uppercase
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N",
    "Ο": "O", "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
}
# A whole word (maximal run of \w) holding a look-alike: it starts only where a word starts (the look-behind
# fails at once elsewhere) and its possessive runs never backtrack, so a text costs one pass (``\w*[...]\w*``
# retried every long word from each of its positions: quadratic).
_HOMOGLYPH_CLASS = "".join(HOMOGLYPHS)
_HOMOGLYPH_WORD = re.compile(r"(?<!\w)[^\W" + _HOMOGLYPH_CLASS + r"]*+[" + _HOMOGLYPH_CLASS + r"]\w*+")
_LATIN_LETTER = re.compile(r"[A-Za-z]")
_CYRILLIC_OR_GREEK_LETTER = re.compile(r"[\u0370-\u03ff\u0400-\u052f]")

# Whitespace characters that are controls but mean "line break" to people (str.splitlines' set).
_LINE_BREAKS = re.compile(r"\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# A run of 2+ horizontal spaces inside a line, or one unusual space character anywhere.
_SPACES = re.compile(r"(?<=\S)[^\S\n]{2,}(?=\S)|[^\S\n \t]")
# ASCII text with none of these has only " " and "\n" for whitespace: its one edit is a space run
_ASCII_OTHER_SPACE = re.compile(r"[\t\r\x0b\x0c\x1c-\x1f]")
_SPACE_RUN = re.compile(r"  +")
_ASCII_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f]")
_NON_ASCII_RUN = re.compile(r"[\x00-\x7f]?[^\x00-\x7f]+", re.DOTALL)
# Unicode's stream-safe text format allows 30 non-starters in a row: longer combining sequences are normalised
# in pieces of this many characters (_stream_safe)
MAX_SEQUENCE = 32


@dataclass(frozen=True, slots=True)
class NormalizedText:
    """The normalised text, which stages changed it, and offsets back into the original."""

    text: str
    original: str
    changes: tuple[str, ...]  # stage names (STAGES order) that changed the text
    starts: np.ndarray | None = None  # original start of each normalised character; None: identity
    ends: np.ndarray | None = None  # original end (exclusive) of each normalised character

    def __repr__(self) -> str:
        return f"NormalizedText(len={len(self.text)}, original_len={len(self.original)}, changes={self.changes})"

    def original_spans(self, spans) -> np.ndarray:
        """[N, 2] (start, end) spans in the normalised text -> the same spans in the original text."""
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        if self.starts is None:
            return spans.copy()
        start, end = spans[:, 0], spans[:, 1]
        starts = np.append(self.starts, len(self.original))
        out_start = starts[np.clip(start, 0, len(self.text))]
        nonempty = end > start
        out_end = out_start.copy()
        out_end[nonempty] = self.ends[end[nonempty] - 1]
        return np.stack([out_start, out_end], axis=1)

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """One (start, end) span of the normalised text in the original text."""
        (a, b), = self.original_spans([[start, end]]).tolist()
        return a, b


def normalize(text: str, stages: bool | Iterable[str] = True) -> NormalizedText:
    """Apply the chosen ``stages`` (True: all, False: none, or an iterable of STAGES names).

    The result's ``changes`` lists the stages that actually changed something."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected str, got {type(text).__name__}")
    chosen = _chosen_stages(stages)
    current = text
    starts = ends = None
    changes = []
    for name in STAGES:
        if name not in chosen:
            continue
        result = _STAGE_FUNCTIONS[name](current)
        if result is None:
            continue
        current, stage_starts, stage_ends = result
        changes.append(name)
        if stage_starts is None:  # length-preserving, one character for one
            continue
        if starts is None:
            starts, ends = stage_starts, stage_ends
        else:  # compose: normalised char -> stage input span -> original span
            starts, ends = starts[stage_starts], ends[stage_ends - 1]
    return NormalizedText(current, text, tuple(changes), starts, ends)


def _chosen_stages(stages: bool | Iterable[str]) -> frozenset[str]:
    if stages is True:
        return frozenset(STAGES)
    if stages is False or stages is None:
        return frozenset()
    if isinstance(stages, str):
        stages = [stages]
    chosen = frozenset(stages)
    unknown = chosen - set(STAGES)
    if unknown:
        raise FieldError("normalize", f"unknown stage(s) {', '.join(sorted(unknown))} (known: {', '.join(STAGES)})")
    return chosen


# ---------------------------------------------------------------------------------------- edits

Edit = tuple[int, int, str]  # replace text[start:end] by the string


def _apply_edits(text: str, edits: list[Edit]) -> tuple[str, np.ndarray, np.ndarray]:
    """Apply sorted, non-overlapping edits; each output character maps to its source span. The spans are
    built from one array per kind of piece (kept runs, replacements), not one per edit: a text with an
    edit at every character costs a few list appends per edit."""
    parts: list[str] = []
    lengths: list[int] = []  # output characters of each piece
    sources: list[int] = []  # where each piece starts in ``text``
    source_ends: list[int] = []  # a replacement's source end; -1 for a kept run
    pos = 0
    for a, b, replacement in edits:
        if a > pos:
            parts.append(text[pos:a])
            lengths.append(a - pos), sources.append(pos), source_ends.append(-1)
        if replacement:
            parts.append(replacement)
            lengths.append(len(replacement)), sources.append(a), source_ends.append(b)
        pos = b
    if pos < len(text):
        parts.append(text[pos:])
        lengths.append(len(text) - pos), sources.append(pos), source_ends.append(-1)
    counts = np.asarray(lengths, dtype=np.int64)
    kept = np.asarray(source_ends, dtype=np.int64) < 0
    piece_starts = np.cumsum(counts) - counts  # each piece's first output character
    # a kept run's characters count up from its source start; a replacement's all point at its source start
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(piece_starts, counts)
    starts = np.repeat(np.asarray(sources, dtype=np.int64), counts) + within * np.repeat(kept, counts)
    ends = np.where(np.repeat(kept, counts), starts + 1, np.repeat(np.asarray(source_ends, dtype=np.int64), counts))
    return "".join(parts), starts, ends


def _from_edits(text: str, edits: list[Edit]):
    return _apply_edits(text, edits) if edits else None


# --------------------------------------------------------------------------------------- stages


@functools.cache
def _invisible_pattern() -> re.Pattern:
    """Format (Cf) and non-whitespace control (Cc) characters, variation selectors, fillers."""
    keep = set("\t\n\r\x0b\x0c\x85")  # whitespace controls: the whitespace stage handles them
    chars = [
        chr(cp)
        for block in (range(0x20000), range(0xE0000, 0xE1000))  # Cf/Cc live in planes 0, 1, 14
        for cp in block
        if unicodedata.category(chr(cp)) in ("Cf", "Cc") and chr(cp) not in keep
    ]
    extra = "\u034f\u115f\u1160\u3164\uffa0\ufe00-\ufe0f\U000e0100-\U000e01ef"
    body = "".join(re.escape(c) for c in chars)
    return re.compile(f"[{body}{extra}]")


def _remove_invisible(text: str):
    pattern = _ASCII_INVISIBLE if text.isascii() else _invisible_pattern()
    return _from_edits(text, [(m.start(), m.end(), "") for m in pattern.finditer(text)])


def _starts_sequence(char: str) -> bool:
    """Not a combining mark, nor a Hangul medial/final jamo (class 0, yet they compose with the syllable
    before them: U+1160-U+11FF, U+D7B0-U+D7FF)."""
    return not unicodedata.combining(char) and not ("\u1160" <= char <= "\u11ff" or "\ud7b0" <= char <= "\ud7ff")


def _stream_safe(sequences: Iterable[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Combining sequences cut into pieces of at most MAX_SEQUENCE characters, as Unicode's stream-safe text
    format cuts them (UAX #15: a CGJ after 30 non-starters): text never holds longer ones, and one (a letter
    and 50,000 accents) would cost quadratic time in CPython's canonical ordering (insertion sort) and give its
    every token the whole sequence as its span in the original text."""
    for a, b in sequences:
        if b - a <= MAX_SEQUENCE:
            yield a, b
        else:
            yield from ((start, min(b, start + MAX_SEQUENCE)) for start in range(a, b, MAX_SEQUENCE))


def _nfkc(text: str):
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return None
    edits: list[Edit] = []
    for run in _NON_ASCII_RUN.finditer(text):
        chunk = run.group()
        if unicodedata.is_normalized("NFKC", chunk):
            continue
        # split the run into combining sequences (a starter and the marks after it)
        bounds = [i for i, ch in enumerate(chunk) if i == 0 or _starts_sequence(ch)] + [len(chunk)]
        for a, b in _stream_safe(zip(bounds, bounds[1:])):
            piece = chunk[a:b]
            folded = unicodedata.normalize("NFKC", piece)
            if folded != piece:
                edits.append((run.start() + a, run.start() + b, folded))
    return _from_edits(text, edits)


def _fold_homoglyphs(text: str):
    if text.isascii():
        return None
    words = list(_HOMOGLYPH_WORD.finditer(text))
    if not words:
        return None
    chars = None
    pending = []
    for word in words:  # words that mix scripts are look-alike attacks whatever the text
        if _LATIN_LETTER.search(word.group()):
            chars = chars if chars is not None else list(text)
            _fold_word(chars, text, word)
        else:
            pending.append(word)
    folded = "".join(chars) if chars is not None else text
    # all-look-alike words are folded only in mostly-Latin text (counted after the mixed words)
    if pending and len(_LATIN_LETTER.findall(folded)) > len(_CYRILLIC_OR_GREEK_LETTER.findall(folded)):
        chars = chars if chars is not None else list(text)
        for word in pending:
            _fold_word(chars, text, word)
    if chars is None:
        return None
    return "".join(chars), None, None  # one character for one: offsets unchanged


def _fold_word(chars: list[str], text: str, word: re.Match) -> None:
    """Fold the word's look-alikes in ``chars``; a letter carrying a combining mark is kept (folded,
    it would need a new NFKC composition, which this length-preserving stage does not do)."""
    for i in range(word.start(), word.end()):
        if text[i] in HOMOGLYPHS and not (i + 1 < len(text) and unicodedata.combining(text[i + 1])):
            chars[i] = HOMOGLYPHS[text[i]]


def _fold_whitespace(text: str):
    if text.isascii() and not _ASCII_OTHER_SPACE.search(text):
        return _fold_ascii_space_runs(text)
    edits: list[Edit] = [(m.start(), m.end(), "\n") for m in _LINE_BREAKS.finditer(text)]
    if edits:
        text_after_breaks, starts, ends = _apply_edits(text, edits)
    else:
        text_after_breaks, starts, ends = text, None, None
    t = text_after_breaks
    space_edits = [(m.start(), m.end(), " ") for m in _SPACES.finditer(t) if m.group() != " "]
    if not space_edits:
        return (text_after_breaks, starts, ends) if edits else None
    folded, s2, e2 = _apply_edits(text_after_breaks, space_edits)
    if starts is not None:
        s2, e2 = starts[s2], ends[e2 - 1]
    return folded, s2, e2


def _fold_ascii_space_runs(text: str):
    """``_fold_whitespace`` for ASCII text whose only whitespace is " " and "\n" (3-10x faster: the
    general pattern tests a Unicode class at every character): runs of 2+ spaces between two
    non-space characters become one space."""
    end = len(text)
    edits: list[Edit] = [(a, b, " ") for a, b in (m.span() for m in _SPACE_RUN.finditer(text))
                         if a > 0 and b < end and text[a - 1] != "\n" and text[b] != "\n"]
    return _apply_edits(text, edits) if edits else None


_STAGE_FUNCTIONS = {
    "invisible": _remove_invisible,
    "nfkc": _nfkc,
    "homoglyphs": _fold_homoglyphs,
    "whitespace": _fold_whitespace,
}
