"""The visible text of a text that may carry a C2PA manifest inside it (C2PA 2.4 Annex A.8).

An A.8 wrapper is U+FEFF followed by a run of Unicode variation selectors at the end of the text; it is
what ``c2pa_unstructured_text`` (pinned in pyproject.toml) embeds and finds. Hashes of a generated text
(receipts, manifests' data hashes) are over the visible text: the wrapper removed.
"""

from __future__ import annotations

import unicodedata

import c2pa_unstructured_text

WRAPPER_MARK = c2pa_unstructured_text.MARKER  # U+FEFF: no wrapper can be there without it


def visible_text(text: str) -> str:
    """``text`` without its A.8 wrapper, NFC-normalised as the wrapper's data hash is; unchanged when it has
    no wrapper (one substring test)."""
    if WRAPPER_MARK not in text:
        return text
    found = c2pa_unstructured_text.extract(text)
    if found is None:
        return text
    return unicodedata.normalize("NFC", c2pa_unstructured_text.strip(text, found["start"], found["length"]))
