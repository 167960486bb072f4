"""Advanced decoding, each keeping the watermark: beam search, n/best_of, speculative, contrastive and MBR decoding.

``run_decoding`` (or ``DecodingParams.run``, which ``Engine.decode`` calls) is the one entry: it
validates the request and dispatches to the method's module. Each method runs synchronously on the
caller's thread over the engine's public surface (engine_interface.DecodingEngine): beam search and
n/best_of in the engine's own KV pool (``engine.branches``, between engine steps), speculative and
contrastive decoding over their own caches; every method samples and scores through the engine's one
LogitsPipeline. Plain sampling with n = 1 goes through ``engine.generate``.
"""

from __future__ import annotations

from generation.decoding.engine_interface import DecodingEngine
from generation.decoding.params import DecodingParams
from generation.sample.sampler import SamplingParams
from generation.sequence import RequestOutput
from watermark.scheme import Watermark

__all__ = ["DecodingEngine", "DecodingParams", "run_decoding"]


def run_decoding(engine: DecodingEngine, prompt: str | list[int], params: SamplingParams,
                 decoding: DecodingParams | None = None, watermark: Watermark | None = None) -> list[RequestOutput]:
    """Decode one prompt as ``decoding`` asks; finished outputs, best first when ranked.

    Beam search returns the n best beams; sampling with n > 1 or best_of > 1 the n most likely of
    best_of siblings; speculative / contrastive / MBR one output. Raises ValueError for a bad request
    (prompt, params, or a combination the method cannot honour), naming the settings."""
    decoding = decoding if decoding is not None else DecodingParams()
    if not isinstance(decoding, DecodingParams):
        raise TypeError(f"decoding must be DecodingParams or None, got {type(decoding).__name__}")
    return decoding.run(engine, prompt, params, watermark)
