"""Advanced decoding (issue #7): beam search, n/best_of, speculative, contrastive and MBR decoding.

``run_decoding`` is the one entry: it validates the request and dispatches to the method's module.
Each method runs synchronously on the caller's thread over the engine's model with its own cache, so
the engine's slot cache and scheduler are never disturbed; plain sampling with n = 1 goes through the
engine's normal path (``engine.generate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from generation.decoding.params import DecodingParams

if TYPE_CHECKING:
    from generation.engine import Engine
    from generation.sampling import SamplingParams
    from generation.sequence import RequestOutput
    from watermark.scheme import Watermark

__all__ = ["DecodingParams", "run_decoding"]


def run_decoding(engine: Engine, prompt: str | list[int], params: SamplingParams,
                 decoding: DecodingParams | None = None, watermark: Watermark | None = None) -> list[RequestOutput]:
    """Decode one prompt as ``decoding`` asks; finished outputs, best first when ranked.

    Beam search returns the n best beams; sampling with n > 1 or best_of > 1 the n most likely of
    best_of siblings; speculative / contrastive / MBR one output. Raises ValueError for a bad request
    (prompt, params, or a combination the method cannot honour), naming the settings."""
    from generation.sampling import SamplingParams

    decoding = decoding if decoding is not None else DecodingParams()
    if not isinstance(decoding, DecodingParams):
        raise TypeError(f"decoding must be DecodingParams or None, got {type(decoding).__name__}")
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    method = decoding.method
    if method is None and decoding.num_samples == 1:
        return engine.generate([prompt], params, watermarks=[watermark], use_tqdm=False)
    prompt_ids = engine._prompt_ids(prompt)  # the engine's own prompt checks, as submit
    params.validate_for_vocab(engine.vocab_size)
    if watermark is not None and getattr(watermark, "vocab_size", engine.vocab_size) != engine.vocab_size:
        raise ValueError(f"watermark: built for vocab_size {watermark.vocab_size}, model has {engine.vocab_size}")
    if method == "beam":
        from generation.decoding.beam import run_beam

        return run_beam(engine, prompt_ids, params, decoding.beam, watermark, n=decoding.n)
    if method == "speculative":
        from generation.decoding.speculative import run_speculative

        return run_speculative(engine, prompt_ids, params, decoding.speculative, watermark)
    if method == "contrastive":
        from generation.decoding.contrastive import run_contrastive

        return run_contrastive(engine, prompt_ids, params, decoding.contrastive, watermark)
    if method == "mbr":
        from generation.decoding.mbr import run_mbr

        return run_mbr(engine, prompt_ids, params, decoding.mbr, watermark)
    from generation.decoding.best_of import run_best_of

    return run_best_of(engine, prompt_ids, params, decoding.n, decoding.num_samples, watermark)
