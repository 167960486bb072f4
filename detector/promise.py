"""What a keyed verdict's false-positive rate promises, and on what condition (docs/detection.md, "The
false-positive promise").

The stated rate alpha (P(Z >= 4) by default) is a promise about human text judged under the ONE key a deployment
runs. On one collection of texts (a code base, a standard library, a documentation set) a fixed key's null is
shifted by the units the collection's texts share and no shipped table knows (docs/detection.md, "Why a
fixed key shifts the null"). How far, per kind of text, was measured over held-out collections in several languages
(docs/research/key-shift-collections.md). Every keyed kgw verdict carries one of two promises:

* ``measured``: the key was calibrated on the deployment's own texts of the verdict's kind
  (``provmark keys calibrate --corpus``, at least MIN_MEASURED_TEXTS of them). Their common units are left out of
  every count (``detector.your_units``), the key's null measured there holds the guard
  (``detector.calibration``), and what one half of a collection cannot know of its other half is covered by the
  smaller MEASURED_MARGIN.
* ``bounded``: nobody measured the collection the text comes from. The p-value is taken under a null shifted by
  the margin that a collection of the text's kind shifts a fixed key's null by (BOUNDED_MARGIN: a high quantile of
  the key-collection shifts measured on the fit collections, checked on held-out ones):
  p = P(Z >= (z - shift - margin) / scale), (shift, scale) being the key's guard, and never smaller than the
  exact binomial p-value.

A margin m costs power: a watermarked text needs about ((z_threshold + m) / z_threshold)^2 times the tokens to
reach the threshold (``tokens_factor``); every verdict states it.

The kind of a text is read from its tokens: the share that carry code punctuation or a line's indentation
(``codeish_fraction``). CODE_SHARE or more is ``code`` (source code, and documentation dense with markup), less is
``prose``. A text misread as code is only held to the larger margin; code misread as prose is what the prose
margin has to cover, so CODE_SHARE sits low.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from watermark.schemes import family_of
from watermark.text_kind import CODE, CODE_SHARE, KINDS, PROSE, codeish_fraction, codeish_table, kind_of_fraction

__all__ = ["CODE", "CODE_SHARE", "KINDS", "PROSE", "codeish_fraction", "codeish_table", "kind_of_fraction"]

MEASURED, BOUNDED = "measured", "bounded"
MIN_MEASURED_TEXTS = 30  # of the deployment's texts of one kind, scored under the key: that kind is measured
# margins in z, by the scheme's family and the kind of text (research/scripts/key_shift_fit.py, 2026-11-28: the smallest that
# leave at most 0.2 % of cells of 200 texts beyond a doubled rate, over 27 fit collections of 11 languages' code,
# documentation and prose under 30 fixed keys; on 14 held-out collections 0 of 420 cells beyond for selfhash and
# lefthash, 1 of 420 for unigram). lefthash of any width takes lefthash h = 1's (wider contexts repeat less across
# texts), minhash takes selfhash's (both anchor on a keyed min)
BOUNDED_MARGIN = {"selfhash": {PROSE: 0.15, CODE: 0.85}, "lefthash": {PROSE: 0.25, CODE: 1.10},
                  "unigram": {PROSE: 0.50, CODE: 1.10}}
MEASURED_MARGIN = {"selfhash": {PROSE: 0.10, CODE: 0.20}, "lefthash": {PROSE: 0.10, CODE: 0.25},
                   "unigram": {PROSE: 0.45, CODE: 0.50}}
FAMILY = {"selfhash": "selfhash", "minhash": "selfhash", "lefthash": "lefthash", "unigram": "unigram"}
CONDITION = {MEASURED: "measured on your texts (keys calibrate --corpus)",
             BOUNDED: "bounded for text from a collection nobody measured"}


def text_kind(vocab, ids: np.ndarray) -> str:
    """``code`` or ``prose``: the kind the verdict's margin is sized by (module docstring)."""
    return kind_of_fraction(codeish_fraction(vocab, ids))


def margin_for(scheme: str, kind: str, promise: str) -> float:
    """The margin in z of ``promise`` for a text of ``kind`` under a kgw ``scheme``."""
    table = MEASURED_MARGIN if promise == MEASURED else BOUNDED_MARGIN
    return table[FAMILY.get(scheme, "selfhash")][kind]


def tokens_factor(margin: float, z_threshold: float) -> float | None:
    """About how many times the tokens a watermarked text needs to reach the threshold with the margin as without:
    z grows as sqrt(T) at a fixed green fraction. None for a threshold at or below 0 (a false-positive rate of 1/2
    or more), where no number of tokens is needed without the margin."""
    if z_threshold <= 0.0:
        return None
    return ((z_threshold + margin) / z_threshold) ** 2


@dataclass(frozen=True, slots=True)
class Promise:
    """The promise one verdict's p-value carries: ``measured`` or ``bounded``, the text's kind and the margin."""

    promise: str
    kind: str
    margin: float

    def to_dict(self, raised: bool, z_threshold: float) -> dict:
        """A new dict (what the verdict carries); its values are made once per promise and threshold."""
        key = (self, raised, z_threshold)
        found = _stated.get(key)
        if found is None:
            found = _stated[key] = {"promise": self.promise, "kind": self.kind, "margin": self.margin, "raised": raised,
                                    "z_needed": round(z_threshold + self.margin, 4),
                                    "tokens_factor": _rounded(tokens_factor(self.margin, z_threshold)),
                                    "condition": CONDITION[self.promise]}
        return dict(found)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


_stated: dict[tuple, dict] = {}  # (promise, raised, z threshold) -> its dict: a handful per process


def measured_kinds(calibration) -> dict:
    """The kinds of the deployment's texts the key was calibrated on (``keys calibrate --corpus``): {kind: stats}."""
    if calibration is None:
        return {}
    return (calibration.domains.get("yours") or {}).get("kinds") or {}


def promise_for(calibration, scheme: str, kind: str) -> Promise:
    """``measured`` where the key's calibration holds at least MIN_MEASURED_TEXTS of the deployment's texts of
    ``kind``, else ``bounded``."""
    measured = calibration is not None and measured_kinds(calibration).get(kind, {}).get("n", 0) >= MIN_MEASURED_TEXTS
    key = (MEASURED if measured else BOUNDED, kind, FAMILY.get(scheme, "selfhash"))
    found = _promises.get(key)
    if found is None:
        found = _promises[key] = Promise(key[0], kind, margin_for(scheme, kind, key[0]))
    return found


_promises: dict[tuple, Promise] = {}  # (promise, kind, family) -> the one Promise of it


def promised_p_value(p_value: float, z: float, total: int, calibration, promise: Promise | None) -> tuple[float, bool]:
    """The verdict's p-value under the key's guarded null (``detector.calibration.Bucket.guard``; N(0, 1) without a
    calibration) shifted by the promise's margin (none without a promise: a public hf spec): never smaller than
    ``p_value``. Returns (p, whether it rose)."""
    if total <= 0 or not math.isfinite(z):
        return p_value, False
    shift, scale = calibration.bucket(total).guard if calibration is not None else (0.0, 1.0)
    shift += promise.margin if promise is not None else 0.0
    if shift == 0.0 and scale == 1.0:
        return p_value, False
    held = 0.5 * math.erfc((z - shift) / scale * _ROOT_HALF)  # P(Z >= (z - shift) / scale), ~20x cheaper than ndtr
    return (held, True) if held > p_value else (p_value, False)


_ROOT_HALF = math.sqrt(0.5)


def held_p_value(p_value: float, z: float, margin: float) -> float:
    """``p_value`` or P(Z >= z - margin), the larger (a window's test under the verdict's promise)."""
    if margin <= 0.0 or not math.isfinite(z):
        return p_value
    return max(p_value, 0.5 * math.erfc((z - margin) * _ROOT_HALF))


def prefix_margins(vocab, ids: np.ndarray, scheme: str, calibration) -> np.ndarray:
    """Float [len(ids) + 1]: entry L is the margin a verdict on the first L tokens alone is held to (its kind read from
    those tokens, its promise from the key's calibration): what the evaluation's prefix curves apply."""
    marks = np.concatenate(([0], np.cumsum(codeish_table(vocab).take(ids, mode="clip"), dtype=np.int64)))
    lengths = np.maximum(np.arange(marks.shape[0]), 1)
    code = marks >= CODE_SHARE * lengths
    margins = [promise_for(calibration, scheme, kind).margin for kind in KINDS]
    return np.where(code, margins[KINDS.index(CODE)], margins[KINDS.index(PROSE)])


def kinds_of(vocab, token_ids: list) -> list[str]:
    """The kind of each text (token id lists, as ``detector.calibrate.token_ids_of`` gives them)."""
    return [text_kind(vocab, np.asarray(ids, dtype=np.int64)) for ids in token_ids]


UNIGRAM_ON_CODE = ("unigram leaves most source code without enough units to score: a code file keeps a handful "
                   "of its tokens (every token common in human text is left out), so its verdicts on code are mostly "
                   "insufficient_text (31 of 700 library files and 50 of 500 C headers scored); for code use the "
                   "default spec (selfhash) or lefthash")


def spec_note(spec) -> str | None:
    """What a user picking ``spec`` for a key should know about the texts it can judge; None when nothing."""
    return UNIGRAM_ON_CODE if spec is not None and family_of(spec).common_units_as(spec) == "unigram" else None


def describe() -> dict:
    """The rule and its numbers, as research/scripts/key_shift_table.py records them beside its measurements."""
    return {"code_share": CODE_SHARE, "min_measured_texts": MIN_MEASURED_TEXTS, "bounded_margin": BOUNDED_MARGIN,
            "measured_margin": MEASURED_MARGIN}
