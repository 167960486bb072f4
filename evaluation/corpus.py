"""The human corpus the evaluation draws prompts and negatives from.

``lee_background.cor`` (Lee, Pincombe and Welsh 2005: 299 short Australian news articles from the
ABC, one per line) ships inside gensim's test data. It is read as a plain file found through the
installed distribution's metadata; gensim itself is never imported (it is heavy and not needed).

Each document splits into a prompt (its first sentence) and a body (the rest): the prompt asks the
model to continue the article; the body, cut to the same token budget, is a human-written negative.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CORPUS_DISTRIBUTION = "gensim"
CORPUS_FILE = "gensim/test/test_data/lee_background.cor"
# Lee's 50 test articles, disjoint from the 299: held-out prompts beyond what the main file leaves over
SECOND_FILE = "gensim/test/test_data/lee.cor"
INSTALL_HINT = "pip install gensim  (only its test data file is read)"

# Words that end in a full stop without ending a sentence (titles, months, common short forms).
_ABBREVIATIONS = frozenset(
    ["mr", "mrs", "ms", "dr", "st", "gen", "col", "lt", "sgt", "capt", "prof", "sen", "rep", "gov", "jr", "sr",
     "inc", "ltd", "co", "corp", "no", "vs", "etc", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept",
     "oct", "nov", "dec", "mt", "ft", "u.s", "u.n", "a.m", "p.m"])
# A sentence ends at . ! or ? (maybe followed by a closing quote) before spaces and a capital or quote.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"']?\s+(?=[\"'A-Z0-9])")


class CorpusError(FileNotFoundError):
    """The corpus file is not installed."""


@dataclass(slots=True, frozen=True)
class Document:
    """One article: its index in the corpus, first sentence (the prompt) and the rest (a negative)."""

    index: int
    first_sentence: str
    body: str

    @property
    def text(self) -> str:
        return f"{self.first_sentence} {self.body}".strip()


def corpus_path(file: str = CORPUS_FILE) -> Path:
    """Where the installed corpus file is; CorpusError with an install hint when it is missing."""
    try:
        path = Path(importlib.metadata.distribution(CORPUS_DISTRIBUTION).locate_file(file))
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(f"the human corpus needs the {CORPUS_DISTRIBUTION!r} package: {INSTALL_HINT}") from None
    if not path.is_file():
        raise CorpusError(f"corpus file {file} not found in the installed {CORPUS_DISTRIBUTION}")
    return path


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the sentences of ``text``, covering it up to whitespace."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        head = text[start: match.start()].rstrip("\"'")
        last_word = head.rsplit(None, 1)[-1].rstrip(".!?").lower() if head.split() else ""
        if last_word in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isalpha()):
            continue  # "Mr. Howard", "George W. Bush": not a sentence end
        end = match.start() + len(match.group(0).rstrip())  # keep a closing quote with its sentence
        spans.append((start, end))
        start = match.end()
    if text[start:].strip():
        spans.append((start, len(text.rstrip())))
    return spans


def split_first_sentence(text: str) -> tuple[str, str]:
    """(first sentence, rest) of ``text``; the rest is empty when there is one sentence."""
    text = " ".join(text.split())
    spans = sentence_spans(text)
    if len(spans) <= 1:
        return text, ""
    return text[: spans[0][1]].strip(), text[spans[1][0]:].strip()


@lru_cache(maxsize=2)
def load_documents(file: str = CORPUS_FILE) -> tuple[Document, ...]:
    """Every article of the corpus (or of ``SECOND_FILE``), in file order, split into first sentence and body."""
    lines = corpus_path(file).read_text(encoding="utf-8", errors="replace").splitlines()
    documents = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        first, body = split_first_sentence(line)
        documents.append(Document(index, first, body))
    return tuple(documents)


def prompt_documents(n: int, min_body_words: int = 40) -> list[Document]:
    """The first ``n`` articles whose body has at least ``min_body_words`` words (deterministic)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected a positive integer, got {n!r}")
    chosen = [d for d in load_documents() if len(d.body.split()) >= min_body_words]
    if n > len(chosen):
        raise ValueError(f"n: the corpus has {len(chosen)} usable articles, {n} asked for")
    return chosen[:n]


def held_out_documents(skip: int, min_body_words: int = 40) -> list[Document]:
    """The usable articles after the first ``skip`` of the corpus, then those of ``SECOND_FILE`` (indices
    from ``SECOND_INDEX``): prompts no run that drew its first ``skip`` from ``prompt_documents`` has seen."""
    first = [d for d in load_documents() if len(d.body.split()) >= min_body_words][skip:]
    second = [Document(SECOND_INDEX + d.index, d.first_sentence, d.body) for d in load_documents(SECOND_FILE)
              if len(d.body.split()) >= min_body_words]
    return first + second


SECOND_INDEX = 10_000  # SECOND_FILE's article i is document SECOND_INDEX + i
