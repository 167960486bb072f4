"""Text similarities for minimum Bayes risk decoding: chrF (character n-gram F-score) and token F1.

Both compare decoded text, not token ids, so they do not depend on how the tokenizer split a word
(" rain" vs "rain" vs "ra"+"in" are different ids, the same characters). chrF is the default:
character n-grams still overlap when two short candidates share no whole word form ("raining" /
"rains"), where word-level scores fall to zero, and it needs no reference tokenization.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CHRF_ORDER = 6  # Popovic 2015, "chrF: character n-gram F-score": n = 1..6
CHRF_BETA = 2.0  # ... recall weighted twice as much as precision (the paper's best-correlating chrF2)


@dataclass(slots=True, frozen=True)
class CharProfile:
    """A text's character n-gram counts for n = 1..order (whitespace removed, as sacrebleu's chrF)."""

    grams: tuple[Counter, ...]

    @classmethod
    def of(cls, text: str, order: int = CHRF_ORDER) -> CharProfile:
        chars = "".join(text.split())
        return cls(tuple(Counter(chars[i:i + n] for i in range(len(chars) - n + 1)) for n in range(1, order + 1)))


def chrf_profiles(hypothesis: CharProfile, reference: CharProfile, beta: float = CHRF_BETA) -> float:
    """chrF_beta in [0, 1] of two profiles: precision and recall averaged over the orders both texts
    reach, then their F-beta. Two empty texts score 1, one empty text 0."""
    precisions, recalls = [], []
    for hyp, ref in zip(hypothesis.grams, reference.grams):
        hyp_total, ref_total = sum(hyp.values()), sum(ref.values())
        if not hyp_total or not ref_total:
            continue  # an order one text is too short for says nothing either way
        overlap = sum((hyp & ref).values())  # clipped counts
        precisions.append(overlap / hyp_total)
        recalls.append(overlap / ref_total)
    if not precisions:
        empty_hyp, empty_ref = not hypothesis.grams[0], not reference.grams[0]
        return 1.0 if empty_hyp and empty_ref else 0.0
    precision, recall = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if precision == 0.0 and recall == 0.0:
        return 0.0
    b2 = beta * beta
    return (1 + b2) * precision * recall / (b2 * precision + recall)


def chrf(hypothesis: str, reference: str, order: int = CHRF_ORDER, beta: float = CHRF_BETA) -> float:
    """chrF_beta of two strings (see chrf_profiles)."""
    return chrf_profiles(CharProfile.of(hypothesis, order), CharProfile.of(reference, order), beta)


def word_counts(text: str) -> Counter:
    """Lower-cased whitespace-separated words with their counts (token F1's bag)."""
    return Counter(text.lower().split())


def token_f1_counts(a: Counter, b: Counter) -> float:
    """Bag-of-words F1 in [0, 1] (SQuAD-style, symmetric); two empty bags score 1."""
    total = sum(a.values()) + sum(b.values())
    if total == 0:
        return 1.0
    return 2.0 * sum((a & b).values()) / total


def token_f1(a: str, b: str) -> float:
    """Bag-of-words F1 of two strings (see token_f1_counts)."""
    return token_f1_counts(word_counts(a), word_counts(b))


@dataclass(slots=True, frozen=True)
class Similarity:
    """A similarity as two steps: ``prepare`` each text once, ``compare(hypothesis, reference)`` pairs."""

    name: str
    prepare: Callable[[str], object]
    compare: Callable[[object, object], float]


def make_similarity(name: str, chrf_order: int = CHRF_ORDER, chrf_beta: float = CHRF_BETA) -> Similarity:
    """The similarity called ``name`` (one of SIMILARITY_NAMES)."""
    if name == "chrf":
        return Similarity(name, lambda text: CharProfile.of(text, chrf_order),
                          lambda hyp, ref: chrf_profiles(hyp, ref, chrf_beta))
    if name == "token_f1":
        return Similarity(name, word_counts, token_f1_counts)
    raise ValueError(f"similarity {name!r}: expected one of {', '.join(SIMILARITY_NAMES)}")


SIMILARITY_NAMES = ("chrf", "token_f1")


def mean_similarities(texts: Sequence[str], similarity: Similarity) -> list[float]:
    """For each text, its mean similarity (as hypothesis) to every other text (as reference).

    This is the sample estimate of the expected utility MBR maximises: the other candidates stand in
    for draws from the model. A single text has no others and scores 0."""
    prepared = [similarity.prepare(t) for t in texts]
    n = len(prepared)
    if n < 2:
        return [0.0] * n
    return [sum(similarity.compare(prepared[i], prepared[j]) for j in range(n) if j != i) / (n - 1)
            for i in range(n)]
