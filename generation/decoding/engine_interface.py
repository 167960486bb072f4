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

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache, attention_mask=None) -> torch.Tensor:
        """Float32 logits [B, V] of the last input position over the caller's cache, as the engine computes them."""

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
