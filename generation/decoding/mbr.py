"""Minimum Bayes risk decoding: sample N candidates, return the one that agrees most with the rest.

The candidates are N copies of the request run through the engine's own continuous batching, each
with a seed derived from the request's seed (so a seeded request is reproducible) and each under the
request's watermark: the returned text is one ordinary watermarked sample and detects like any.
The choice maximises the mean similarity to the other candidates (Eikema & Aziz 2020, "Is MAP
decoding all you need?"; sample-based MBR), with chrF by default (see generation.decoding.similarity).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from generation.decoding.engine_interface import DecodingEngine
from generation.decoding.similarity import (
    CHRF_BETA,
    CHRF_ORDER,
    SIMILARITY_NAMES,
    Similarity,
    make_similarity,
    mean_similarities,
)
from generation.sample.params import SamplingParams
from generation.sequence import RequestOutput, Usage
from watermark.scheme import Watermark

MAX_CANDIDATES = 256  # pairwise similarities grow as N^2; beyond this MBR costs more than it can gain
SEED_DOMAIN = b"provmark/mbr-candidate-seed/v1"  # candidate seeds never collide with other derived seeds


def _fail(field: str, value: object, rule: str) -> None:
    raise ValueError(f"MBRConfig.{field}={value!r}: {rule}")


@dataclass(slots=True)
class MBRConfig:
    """num_candidates samples; ``similarity`` "chrf" (default) or "token_f1"; chrF's n-gram order and beta."""

    num_candidates: int = 8
    similarity: str = "chrf"
    chrf_order: int = CHRF_ORDER
    chrf_beta: float = CHRF_BETA

    def __post_init__(self) -> None:
        for name in ("num_candidates", "chrf_order"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                _fail(name, value, "must be an int")
        if not 2 <= self.num_candidates <= MAX_CANDIDATES:
            _fail("num_candidates", self.num_candidates, f"must be in [2, {MAX_CANDIDATES}] (MBR compares candidates)")
        if self.similarity not in SIMILARITY_NAMES:
            _fail("similarity", self.similarity, f"must be one of {', '.join(SIMILARITY_NAMES)}")
        if self.chrf_order < 1:
            _fail("chrf_order", self.chrf_order, "must be >= 1")
        beta = self.chrf_beta
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta <= 0:
            _fail("chrf_beta", beta, "must be a finite number > 0")

    def make_similarity(self) -> Similarity:
        return make_similarity(self.similarity, self.chrf_order, float(self.chrf_beta))


def candidate_seed(seed: int, index: int) -> int:
    """Candidate ``index``'s seed from the request's seed: a SHA-256 of both, stable across runs and
    platforms, in [0, 2**63), so candidates draw unrelated streams (seed+i would overlap other requests')."""
    digest = hashlib.sha256(SEED_DOMAIN + seed.to_bytes(8, "little") + index.to_bytes(4, "little")).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def select_consensus(texts: Sequence[str], similarity: Similarity) -> tuple[int, list[float]]:
    """The index of the text with the highest mean similarity to the others (the first on ties),
    and every text's mean similarity."""
    if not texts:
        raise ValueError("select_consensus: no candidates")
    means = mean_similarities(texts, similarity)
    best = max(range(len(texts)), key=lambda i: (means[i], -i))
    return best, means


def run_mbr(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, config: MBRConfig,
            watermark: Watermark | None = None) -> list[RequestOutput]:
    """Sample ``config.num_candidates`` completions of ``prompt_ids`` and return ``[best]``: the one
    with the highest mean similarity to the others, with ``decoding_stats`` holding every candidate's
    mean similarity (None for a candidate that failed its constraint, which takes no part) and
    ``usage.completion_tokens`` its own length (the candidates' total is in the stats).

    Every other SamplingParams setting (stops, penalties, constraints, logprobs) applies to each
    candidate as in ``engine.generate``. Raises ValueError for greedy params (N identical candidates)."""
    if not isinstance(config, MBRConfig):
        raise TypeError(f"config must be MBRConfig, got {type(config).__name__}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    if params.greedy:
        raise ValueError(f"MBR with SamplingParams.temperature={params.temperature} (greedy): it gives N identical candidates; "
                         "use temperature > 0")
    if params.seed is None:
        candidate_params = [params] * config.num_candidates  # each candidate gets fresh OS randomness
    else:
        candidate_params = [dataclasses.replace(params, seed=candidate_seed(params.seed, i))
                            for i in range(config.num_candidates)]
    candidates = engine.generate([list(prompt_ids)] * config.num_candidates, candidate_params,
                                 [watermark] * config.num_candidates, use_tqdm=False)
    # a candidate whose constraint failed is no answer; it neither wins nor votes (unless all failed)
    usable = [i for i, c in enumerate(candidates) if c.finish_reason != "error"] or list(range(len(candidates)))
    local_best, local_means = select_consensus([candidates[i].text for i in usable], config.make_similarity())
    best = usable[local_best]
    means: list[float | None] = [None] * len(candidates)
    for i, mean in zip(usable, local_means):
        means[i] = mean
    chosen = candidates[best]
    chosen.decoding_stats = {
        "method": "mbr",
        "similarity": config.similarity,
        "num_candidates": config.num_candidates,
        "chosen": best,
        "mean_similarities": means,
        "candidate_tokens": sum(len(c.token_ids) for c in candidates),
    }
    chosen.usage = Usage(len(chosen.prompt_token_ids), len(chosen.token_ids))
    return [chosen]
