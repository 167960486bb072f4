"""What the sampling watermarks (Gumbel, SynthID) share: the greedy policy, context dedup, n-gram units."""

from __future__ import annotations

import torch


class SamplingWatermarkError(ValueError):
    """A request a sampling watermark cannot serve (greedy decoding); the message says why."""


def require_sampling(temperature: float, scheme: str) -> None:
    """Fail closed on greedy requests: a sampling watermark IS the sampler, so with temperature 0 the
    token is fixed by the logits and the text would silently carry no watermark."""
    if not temperature or temperature <= 0:
        raise SamplingWatermarkError(
            f"{scheme}: a {scheme} watermark replaces random sampling and cannot watermark greedy decoding "
            "(temperature 0); use temperature > 0, or a kgw: spec for greedy requests")


class SeenContexts:
    """The contexts a sequence has been watermarked under, for generation-time dedup: a context seen
    before is sampled without the watermark, so it is not resampled identically (SynthID-Text, G.3)."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[tuple[int, ...]] = set()

    def first_time(self, context: tuple[int, ...]) -> bool:
        """True (and remember it) the first time ``context`` is asked about, False afterwards."""
        if context in self._seen:
            return False
        self._seen.add(context)
        return True


def ngram_units(token_ids, context_width: int) -> torch.Tensor:
    """[T - h, h + 1]: each scored position's context followed by its token."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    n = context_width + 1
    if ids.shape[0] < n:
        return ids.new_zeros((0, n))
    return ids.unfold(0, n, 1)
