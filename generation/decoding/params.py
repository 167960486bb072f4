"""DecodingParams: which decoding method a request uses (at most one) and how many outputs it returns.

Plain sampling is the default (no method config). ``n`` outputs are returned; with sampling, ``best_of``
(>= n) siblings are drawn and the n with the highest cumulative logprob kept; with beam search the n best
beams. Combinations that make no sense fail here, at the door, with the fields named.
"""

from __future__ import annotations

from dataclasses import dataclass

from generation.decoding.beam import BeamConfig, run_beam
from generation.decoding.best_of import run_best_of
from generation.decoding.contrastive import ContrastiveConfig, run_contrastive
from generation.decoding.engine_interface import DecodingEngine, check_watermark_vocab
from generation.decoding.mbr import MBRConfig, run_mbr
from generation.decoding.speculative.decode import SpeculativeConfig, run_speculative
from generation.sample.params import SamplingParams
from generation.sample.sampling_stage import check_request
from generation.sequence import RequestOutput
from watermark.sampling_common import SamplingWatermarkError
from watermark.scheme import Watermark
from watermark.schemes import family_of, is_sampling

METHOD_FIELDS = ("beam", "speculative", "contrastive", "mbr")  # at most one of these per request


def check_sampling_method(spec, params: SamplingParams, method: str | None, num_samples: int) -> None:
    """SamplingWatermarkError for the decoding methods a sampling ``spec`` (gumbel, synthid, hf:synthid)
    cannot serve: beam search (it ranks continuations, it does not sample: nothing to key) and, for
    Gumbel, several samples of one prompt (n / best_of > 1, MBR): the keyed race is a deterministic
    function of context and distribution, so every sibling would be the same text."""
    if not is_sampling(spec):
        return
    family = family_of(spec)
    name = family.name
    if method == "beam":
        raise SamplingWatermarkError(f"{name}: beam search ranks continuations and draws nothing, so a sampling "
                                     "watermark has nothing to key; sample (temperature > 0) or use a kgw: spec")
    if family.deterministic_choice and (method == "mbr" or (method is None and num_samples > 1)):
        what = "MBR candidates" if method == "mbr" else "n / best_of siblings"
        raise SamplingWatermarkError(f"{name}: {what} of one prompt would all be the same text (the keyed race "
                                     "is deterministic given the context); use one sample, or a synthid: spec")
    if method == "speculative" and family.committed_context_only:
        raise SamplingWatermarkError(f"{name}: speculative decoding is not supported (its context window "
                                     "follows committed tokens only); decode without it")


def _fail(field: str, value: object, rule: str) -> None:
    raise ValueError(f"DecodingParams.{field}={value!r}: {rule}")


CONFIG_CLASSES = {"beam": BeamConfig, "speculative": SpeculativeConfig, "contrastive": ContrastiveConfig,
                  "mbr": MBRConfig}


@dataclass(slots=True)
class DecodingParams:
    """How to decode one request: ``n`` outputs, sampled ``best_of`` siblings, or one method config."""

    n: int = 1
    best_of: int | None = None  # None = n (sampling only)
    beam: BeamConfig | None = None
    speculative: SpeculativeConfig | None = None
    contrastive: ContrastiveConfig | None = None
    mbr: MBRConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            _fail("n", self.n, "must be an int >= 1")
        if self.best_of is not None:
            if isinstance(self.best_of, bool) or not isinstance(self.best_of, int) or self.best_of < 1:
                _fail("best_of", self.best_of, "must be None or an int >= 1")
            if self.best_of < self.n:
                _fail("best_of", self.best_of, f"must be >= n={self.n} (the n best of best_of samples are returned)")
        chosen = [f for f in METHOD_FIELDS if getattr(self, f) is not None]
        if len(chosen) > 1:
            _fail(chosen[1], "<config>", f"only one decoding method per request, {chosen[0]} is already set")
        for field in chosen:
            value = getattr(self, field)
            expected = CONFIG_CLASSES[field]
            if not isinstance(value, expected):
                _fail(field, type(value).__name__, f"must be a {expected.__name__} or None")
        method = self.method
        if method is not None and self.best_of is not None and self.best_of > 1:
            _fail("best_of", self.best_of, f"applies to sampling only, not to {method} decoding")
        if method == "beam" and self.n > self.beam.num_beams:
            _fail("n", self.n, f"must be <= beam.num_beams={self.beam.num_beams} (beam search returns its n best beams)")
        if method in ("speculative", "contrastive", "mbr") and self.n > 1:
            _fail("n", self.n, f"{method} decoding returns one output; n must be 1")

    @property
    def method(self) -> str | None:
        """'beam', 'speculative', 'contrastive', 'mbr', or None (plain sampling)."""
        return next((f for f in METHOD_FIELDS if getattr(self, f) is not None), None)

    @property
    def num_samples(self) -> int:
        """Siblings plain sampling draws: best_of, or n when best_of is not given."""
        return self.best_of if self.best_of is not None else self.n

    def run(self, engine: DecodingEngine, prompt: str | list[int], params: SamplingParams,
            watermark: Watermark | None = None) -> list[RequestOutput]:
        """Decode one prompt over ``engine`` (see generation.decoding.run_decoding): finished outputs, best
        first when ranked. ValueError for a bad request, naming the settings."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        method = self.method
        if method is None and self.num_samples == 1:
            return engine.generate([prompt], params, watermarks=[watermark], use_tqdm=False)
        check_request(watermark, params)  # greedy with a sampling watermark: refused, as Engine.submit
        prompt_ids = engine.prompt_ids(prompt)  # the engine's own prompt checks, as submit
        params.validate_for_vocab(engine.vocab_size)
        check_watermark_vocab(engine, watermark)
        check_sampling_method(getattr(watermark, "spec", None), params, method, self.num_samples)
        if method == "beam":
            return run_beam(engine, prompt_ids, params, self.beam, watermark, n=self.n)
        if method == "speculative":
            return run_speculative(engine, prompt_ids, params, self.speculative, watermark)
        if method == "contrastive":
            return run_contrastive(engine, prompt_ids, params, self.contrastive, watermark)
        if method == "mbr":
            return run_mbr(engine, prompt_ids, params, self.mbr, watermark)
        return run_best_of(engine, prompt_ids, params, self.n, self.num_samples, watermark)
