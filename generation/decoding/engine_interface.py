"""What decoding methods need of an engine: a small public surface, never its privates.

generation.engine.Engine provides it; so can any object with these members (tests use small fakes).
Decoding depends on this protocol only, and the engine never imports decoding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from generation.models import LoadedModel
from generation.sample import LogitsPipeline
from generation.sample.params import SamplingParams
from generation.sequence import RequestOutput


class Branches(Protocol):
    """Continuations of one prompt run as one batch (beams, n/best_of siblings)."""

    def prefill(self) -> torch.Tensor:
        """Compute the prompt once; float32 logits [1, V] of its last token. Call once, first."""

    def step(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """One token per live branch; float32 logits [branches, V] of each branch's next token."""

    def reorder(self, index: torch.Tensor | list[int]) -> None:
        """Branches ``index`` go on, in that order (repeats fork a branch, left-out ones end)."""

    def close(self) -> None:
        """Give the branches' cache back (idempotent; leaving the ``with`` block calls it)."""

    def __enter__(self) -> Branches: ...

    def __exit__(self, *exc) -> None: ...


class DecodingEngine(Protocol):
    vocab_size: int
    tokenizer: Any
    eos_token_ids: set[int]  # the model's stop ids (a request's own stop_token_ids come on top)
    pipeline: LogitsPipeline  # the one logits pipeline every method samples and scores with
    loaded: LoadedModel  # weights, device, dtype, vocabulary fingerprint and model id

    @property
    def max_model_len(self) -> int: ...

    @property
    def model(self) -> torch.nn.Module: ...

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """Checked prompt token ids (ValueError / TypeError naming the problem)."""

    def branches(self, prompt_ids: list[int], n_branches: int, max_new: int, cache_lookup: bool = True) -> Branches:
        """``n_branches`` continuations of one prompt over the engine's own KV cache, for up to ``max_new``
        steps (the prompt computed once and shared; ``cache_lookup=False``: none of it taken from the prefix
        cache, for seeded requests). Use as a context manager: leaving it gives the cache back."""

    def generate(self, prompts: Sequence, params, watermarks=None, use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Plain generation through the engine's scheduler (finished outputs in input order)."""


def check_watermark_vocab(engine: DecodingEngine, watermark) -> None:
    """ValueError unless ``watermark`` (or None) was built for the engine's vocabulary."""
    if watermark is not None and getattr(watermark, "vocab_size", engine.vocab_size) != engine.vocab_size:
        raise ValueError(f"watermark: built for vocab_size {watermark.vocab_size}, model has {engine.vocab_size}")


def generation_room(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams) -> int:
    """Tokens a request may generate: max_new_tokens, capped by the engine's max_model_len."""
    room = engine.max_model_len - len(prompt_ids)
    if room < 1:
        raise ValueError(f"prompt: {len(prompt_ids)} tokens, but max_model_len={engine.max_model_len} leaves no room to generate")
    return min(params.max_new_tokens, room)
