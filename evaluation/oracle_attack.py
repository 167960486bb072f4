"""The detector as a colour oracle: attacks run by a client holding only a ``detect`` token.

A *target* is a real in-process detector with its own fresh key (default spec), seen through what a
detect-scope caller receives: ``before`` = the service as it was (the whole verdict; any spec under the
key), ``after`` = with the defences (the key bound to its spec, ``Verdict.disclose("detect")``).
The attacker builds texts from whole-word tokens (each re-tokenizes to itself); the evaluator checks its
guesses against the truth (the ``explain`` flags), which the attacker never sees.

Attacks, each reporting queries per unit learned and balanced accuracy (0.5 = no information):

* ``one_position``: a 5-token text has one scored unit; read its colour from ``num_green_tokens``.
* ``spec_switch``: four 2-token texts under ``selfhash, h=1`` predict the ``h=4`` colour when they agree.
* ``gamma_step``: the unit's green/red boundary by bisection over gamma (6 queries).
* ``paired_difference``: the best attack on the coarse, dithered view: z(P + ctx + t) - z(P + ctx) averaged
  over n fresh watermarked prefixes P (each re-draws the dither); accuracy as a function of n.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from detector.scoring_request import DetectOptions
from watermark.config import WatermarkSpec
from watermark.key_info import KeySpecError
from watermark.scheme import Watermark
from watermark.vocab import encode

SWITCH_SPEC = "kgw:scheme=selfhash,h=1,gamma=0.25,delta=2.0"
GAMMA_STEPS = 6  # bisection steps: the boundary to 1/64


@dataclass(slots=True)
class Unit:
    """A target unit: 4 context words and the word after them; ``green`` is the truth (None: not counted)."""

    context: list[int]
    token: int
    green: bool | None = None


class Target:
    """A detect-only client of a real in-process detector; ``defended`` picks the service's behaviour."""

    def __init__(self, detector, defended: bool) -> None:
        self.detector = detector
        self.defended = defended
        self.queries = 0
        self.refused = 0

    def view(self, ids: list[int], spec: str | None = None) -> dict | None:
        """What the caller reads for the text of ``ids`` (None: refused, as a 4xx would be)."""

        self.queries += 1
        text = self.detector.vocab.tokenizer.decode(ids)
        try:
            verdict = self.detector.detect(text, spec=spec)
        except KeySpecError:
            self.refused += 1
            return None
        if self.defended:
            return verdict.disclose("detect")
        full = verdict.to_dict()
        full.pop("explanation")
        return full

    def truth(self, ids: list[int]) -> bool | None:
        """The evaluator's ground truth: the last token's colour if it is counted (never shown to the attacker)."""
        last = self.detector.detect(self.detector.vocab.tokenizer.decode(ids), options=DetectOptions(explain=True)).explanation[-1]
        return bool(last["green"]) if last["counted"] else None


def word_tokens(vocab) -> list[int]:
    """Whole lowercase words with their leading space: every sequence of them re-tokenizes to itself."""

    pieces = vocab.tokenizer.convert_ids_to_tokens(list(range(vocab.vocab_size)))
    words = [i for i, p in enumerate(pieces) if p.startswith("Ġ") and p[1:].isalpha() and p[1:].islower() and len(p) > 4]
    return [i for i in words if encode(vocab, vocab.tokenizer.decode([i])) == [i]]


def watermarked_sequence(mark: Watermark, words: list[int], length: int, green_fraction: float,
                         rng: random.Random) -> list[int]:
    """Word tokens whose colours are green with probability ``green_fraction``: text as the attacker gets it
    from the generation API (made here with the key, standing in for the model)."""
    h = mark.context_width
    out = rng.sample(words, h)
    while len(out) < length:
        want_green = rng.random() < green_fraction
        for _ in range(16):
            word = rng.choice(words)
            if bool(mark.green_flags(out[-h:] + [word])[0]) == want_green:
                break
        out.append(word)
    return out


def balanced_accuracy(guesses: list[bool], truths: list[bool]) -> float:
    g, t = np.asarray(guesses, dtype=bool), np.asarray(truths, dtype=bool)
    if t.all() or not t.any():
        return float((g == t).mean())
    return float(0.5 * (g[t].mean() + (~g[~t]).mean()))


def make_units(target: Target, words: list[int], count: int, rng: random.Random) -> list[Unit]:
    """Random 5-word texts whose last unit is counted, half of them green (so accuracy is balanced)."""
    wanted = {True: count // 2, False: count - count // 2}
    found: dict[bool, list[Unit]] = {True: [], False: []}
    while any(len(found[c]) < wanted[c] for c in wanted):
        ids = rng.sample(words, 5)
        colour = target.truth(ids)
        if colour is not None and len(found[colour]) < wanted[colour]:
            found[colour].append(Unit(ids[:4], ids[4], colour))
    return found[True] + found[False]


def one_position(target: Target, units: list[Unit]) -> dict:
    guesses = []
    for unit in units:
        view = target.view(unit.context + [unit.token])
        seen = None if view is None else view.get("num_green_tokens")
        guesses.append(bool(seen) if seen is not None else False)  # nothing read: guess red (the prior)
    return {"queries_per_unit": 1, "balanced_accuracy": balanced_accuracy(guesses, [u.green for u in units])}


def spec_switch(target: Target, units: list[Unit]) -> dict:
    guesses, decided = [], 0
    for unit in units:
        colours = []
        for word in unit.context:
            view = target.view([word, unit.token], spec=SWITCH_SPEC)
            seen = None if view is None else view.get("num_green_tokens")
            if seen is not None and (view.get("num_tokens_scored") or 0) == 1:
                colours.append(bool(seen))
        agree = len(colours) == len(unit.context) and len(set(colours)) == 1
        decided += agree
        guesses.append(colours[0] if agree else False)
    return {"queries_per_unit": 4, "balanced_accuracy": balanced_accuracy(guesses, [u.green for u in units]),
            "decided_fraction": decided / len(units)}


def gamma_step(target: Target, units: list[Unit], spec: WatermarkSpec) -> dict:
    guesses = []
    for unit in units:
        low, high = 0.0, 1.0  # the unit is green under gamma iff its boundary r < gamma
        for _ in range(GAMMA_STEPS):
            middle = (low + high) / 2
            view = target.view(unit.context + [unit.token], spec=spec.with_(gamma=middle).format())
            seen = None if view is None else view.get("num_green_tokens")
            if seen is None:
                break
            low, high = (low, middle) if seen else (middle, high)
        guesses.append(high <= spec.gamma if (low, high) != (0.0, 1.0) else False)
    return {"queries_per_unit": GAMMA_STEPS, "balanced_accuracy": balanced_accuracy(guesses, [u.green for u in units])}


def paired_difference(target: Target, units: list[Unit], prefix_source: list[int], prefix_tokens: int,
                      max_pairs: int, rng: random.Random, progress=None) -> dict:
    """z(P + ctx + t) - z(P + ctx) over fresh prefixes P; guess green when the mean difference is above the
    midpoint of the two colours' expected steps, (1/2 - gamma) / sqrt(T gamma (1 - gamma))."""
    gamma = WatermarkSpec.default().gamma
    scored = prefix_tokens  # about T: the attacker knows the length, not the counts
    midpoint = (0.5 - gamma) / np.sqrt(scored * gamma * (1 - gamma))
    differences = np.zeros((len(units), max_pairs))
    for i, unit in enumerate(units):
        for j in range(max_pairs):
            start = rng.randrange(0, len(prefix_source) - prefix_tokens)
            base = prefix_source[start:start + prefix_tokens] + unit.context
            with_unit, without = target.view(base + [unit.token]), target.view(base)
            # one more scored unit also shrinks z by about z / 2T whatever its colour
            differences[i, j] = _z(with_unit) - _z(without) + _z(without) / (2 * scored)
        if progress is not None:
            progress.update(1)
    truths = [u.green for u in units]
    curve = {}
    n = 1
    while n <= max_pairs:
        means = differences[:, :n].mean(axis=1)
        curve[n] = balanced_accuracy(list(means > midpoint), truths)
        n *= 2
    return {"accuracy_by_pairs": curve, "prefix_tokens": prefix_tokens, "max_pairs": max_pairs}


def _z(view: dict | None) -> float:
    return 0.0 if view is None or view.get("z_score") is None else float(view["z_score"])
