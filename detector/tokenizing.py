"""Tokenizing pasted text for detection: exactly ``watermark.vocab.encode[_with_offsets]``, with long texts
of byte-level BPE tokenizers cut at pre-token boundaries and encoded on all cores."""

from __future__ import annotations

import json
import re

from watermark.vocab import Vocabulary, encode, encode_with_offsets

CHUNK_CHARS = 1024  # long texts are tokenized in pieces of about this size, in parallel
_CHUNK_BOUNDARY = re.compile(r"(?<=\S) (?=[^\W\d_])")  # a space between a non-space and a letter
_chunkable: dict[int, bool] = {}


def tokenize(vocab: Vocabulary, text: str, with_offsets: bool) -> tuple[list[int], list | None]:
    """Token ids (and offsets) of ``text`` exactly as ``watermark.vocab.encode[_with_offsets]``.

    For byte-level BPE tokenizers (no normaliser, ByteLevel pre-tokenizer without a prefix space)
    a space followed by a letter always starts a pre-token, and BPE never merges across
    pre-tokens, so pieces cut there tokenize to the same ids; the tokenizer's batch call encodes
    them on all cores. Other tokenizers take the plain path."""
    if len(text) < 2 * CHUNK_CHARS or not _is_chunkable(vocab) or not _valid_utf8(text):
        if with_offsets:  # (invalid text goes this way too, for vocab's error message)
            return encode_with_offsets(vocab, text)
        return encode(vocab, text), None
    starts = [0]
    while True:
        found = _CHUNK_BOUNDARY.search(text, starts[-1] + CHUNK_CHARS)
        if found is None:
            break
        starts.append(found.start())
    pieces = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    backend = vocab.tokenizer.backend_tokenizer
    if not with_offsets:
        encodings = backend.encode_batch_fast(pieces, add_special_tokens=False)
        return [i for e in encodings for i in e.ids], None
    encodings = backend.encode_batch(pieces, add_special_tokens=False)
    ids, offsets = [], []
    for start, e in zip(starts, encodings):
        ids.extend(e.ids)
        offsets.extend((a + start, b + start) for a, b in e.offsets)
    return ids, offsets


def _valid_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_chunkable(vocab: Vocabulary) -> bool:
    key = id(vocab.tokenizer)
    found = _chunkable.get(key)
    if found is None:
        config = json.loads(vocab.tokenizer.backend_tokenizer.to_str())
        pre = config.get("pre_tokenizer") or {}
        found = (config.get("normalizer") is None and pre.get("type") == "ByteLevel"
                 and not pre.get("add_prefix_space") and pre.get("use_regex", True))
        _chunkable[key] = found
    return found
