"""Contrastive decoding (Li et al. 2023, "Contrastive Decoding: Open-ended Text Generation as
Optimization", ACL): pick the token the expert likes much more than a weaker amateur does.

At each step, over the plausible tokens V_head = {v : p_expert(v) >= alpha * max_w p_expert(w)}:

    score(v) = log p_expert(v) - beta * log p_amateur(v)        (tokens outside V_head: -inf)

beta = 1 is the paper's objective; beta = 0 at temperature 0 is plain greedy decoding. (O'Brien & Lewis 2023,
"Contrastive Decoding Improves Reasoning in Large Language Models", use (1 + beta) * s_e - beta * s_a
on logits instead; that variant is not implemented here.) The plausibility cut is what keeps the
amateur from promoting tokens the expert finds absurd: the amateur only reorders V_head.

Where the watermark bias goes (``watermark_before_cut``):
- False (default): added to the contrastive scores of V_head, after the cut and before the choice.
  V_head is the unbiased expert's, so every chosen token meets the plausibility constraint; a soft
  watermark lets a green token win when its score is within delta of the best, a hard one removes
  red tokens from V_head (a V_head left empty stays unbiased, as in the engine). The signal is weak:
  CD scores spread over several nats and V_head is small (~2-5 tokens), so +delta rarely flips the
  choice (measured: green fraction 0.32 greedy / 0.18 at T=1 over 60 tokens, z = 0.5-0.9 at 200).
- True: on the expert's logits after penalties and bans, before the cut (the engine's order: the
  watermark precedes truncation). Green tokens down to alpha * exp(-delta) of the expert's best enter
  V_head, which makes the watermark strong (green fraction 0.60 / 0.73 over 60 tokens) but admits
  tokens the unbiased cut would refuse; CD favours exactly those rare tokens, and one measured
  200-token run degenerated into repetition.

Every stage is the engine's LogitsPipeline: penalties, logit bias and bans on the expert's logits, the
watermark stage where ``watermark_before_cut`` puts it, then temperature, truncation and the draw on
the contrastive scores. Temperature 0 takes the argmax (the paper's search); temperature > 0 samples
from softmax(score / temperature) after the request's truncation (top-k, top-p, ...), seeded by
``params.seed``. Expert and amateur each run with their own batch-1 cache (speculative/cache.py, CachedLM):
the engine's paged cache and scheduler are never touched.
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from generation.decoding.engine_interface import DecodingEngine, check_watermark_vocab
from generation.decoding.speculative.cache import CachedLM
from generation.models import LoadedModel, load_model
from generation.sample import StepRows
from generation.sample.params import GREEDY_TEMPERATURE, SamplerState, SamplingParams
from generation.sample.sampler import NEG_INF
from generation.sequence import OutputDetails, RequestOutput, TextTracker, request_output
from watermark.scheme import Watermark
from watermark.vocab import DEFAULT_MODEL_ALIASES, DEFAULT_MODEL_ID

DEFAULT_ALPHA = 0.1  # Li et al. 2023 use alpha = 0.1 throughout
AMATEUR_LOGP_FLOOR = -1e4  # an amateur -inf would make a +inf score; any finite floor keeps the order
_request_ids = itertools.count()  # outputs are named contrastive-0, -1, ... (no engine request id exists)


def _fail(field_name: str, value: object, rule: str) -> None:
    raise ValueError(f"ContrastiveConfig.{field_name}={value!r}: {rule}")


def _number(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(slots=True)
class ContrastiveConfig:
    """Contrastive decoding settings.

    ``amateur_model``: a local HF model folder sharing the expert's tokenizer, or "default" for the
    embedded model (loaded on first use, on the expert's device and dtype, then kept; a missing
    folder raises generation.models.ModelAssetError, a FileNotFoundError). ``amateur``: an already
    loaded model instead (tests, or callers holding one); exactly one of the two is given. ``alpha``: plausibility cut-off as a
    fraction of the expert's top probability. ``beta``: the amateur's weight. ``amateur_temperature``:
    divides the amateur's logits before its log-softmax (> 1 flattens it, weakening the penalty).
    ``watermark_before_cut``: where the watermark bias goes (see the module docstring)."""

    amateur_model: str | None = None
    alpha: float = DEFAULT_ALPHA
    beta: float = 1.0
    amateur_temperature: float = 1.0
    watermark_before_cut: bool = False
    amateur: LoadedModel | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        folder = self.amateur_model
        if folder is not None and (not isinstance(folder, (str, Path)) or not str(folder).strip()):
            _fail("amateur_model", self.amateur_model, "must be a local model folder path or None")
        if self.amateur is not None and not isinstance(self.amateur, LoadedModel):
            _fail("amateur", type(self.amateur).__name__, "must be a generation.models.LoadedModel or None")
        if (self.amateur_model is None) == (self.amateur is None):
            _fail("amateur_model", self.amateur_model,
                  "give exactly one amateur: a model folder (amateur_model) or a loaded model (amateur)")
        if not _number(self.alpha) or not 0.0 < self.alpha <= 1.0:
            _fail("alpha", self.alpha, "must be in (0, 1]")
        if not _number(self.beta) or self.beta < 0.0:
            _fail("beta", self.beta, "must be a finite number >= 0")
        if not _number(self.amateur_temperature) or self.amateur_temperature < GREEDY_TEMPERATURE:
            # below it the amateur's logits / T overflow fp32 and its log-softmax is NaN
            _fail("amateur_temperature", self.amateur_temperature, f"must be a finite number >= {GREEDY_TEMPERATURE}")
        if not isinstance(self.watermark_before_cut, bool):
            _fail("watermark_before_cut", self.watermark_before_cut, "must be True or False")


def contrastive_scores(expert_logp: torch.Tensor, amateur_logp: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """Scores [B, V]: expert_logp - beta * amateur_logp on the plausible tokens (expert probability >=
    alpha times the row's best), -inf elsewhere. Inputs are log-probabilities [B, V]."""
    best = expert_logp.amax(-1, keepdim=True)
    plausible = expert_logp >= best + math.log(alpha)
    amateur = amateur_logp.clamp_min(AMATEUR_LOGP_FLOOR)
    scores = expert_logp - beta * amateur if beta else expert_logp.clone()
    return scores.masked_fill_(~plausible, NEG_INF)


_amateurs: dict[tuple, LoadedModel] = {}  # (folder, device, dtype) -> loaded amateur, kept for reuse
_amateurs_lock = threading.Lock()
MAX_CACHED_AMATEURS = 2  # amateurs are small by design; two covers switching between a pair


def _amateur_for(engine: DecodingEngine, config: ContrastiveConfig) -> LoadedModel:
    if config.amateur is not None:
        return config.amateur
    expert = engine.loaded
    name = str(config.amateur_model).strip()
    # "default" names the embedded model (as load_model does); anything else is a folder
    is_default = name.lower() in DEFAULT_MODEL_ALIASES
    source = name if is_default else str(Path(name).expanduser().resolve())
    if is_default and expert.model_id == DEFAULT_MODEL_ID:
        return expert  # the embedded model against itself: one copy of the weights, two caches
    key = (source, str(expert.device), expert.dtype)
    with _amateurs_lock:
        found = _amateurs.get(key)
        if found is None:
            found = load_model(source, device=expert.device, dtype=expert.dtype)
            if len(_amateurs) >= MAX_CACHED_AMATEURS:
                _amateurs.pop(next(iter(_amateurs)))
            _amateurs[key] = found
    return found


def check_shared_tokenizer(engine: DecodingEngine, amateur: LoadedModel) -> None:
    """ValueError unless the amateur scores the expert's vocabulary: same logits width and, when both
    vocabularies carry one, the same tokenizer fingerprint."""
    width = int(amateur.model.config.vocab_size)
    if width != engine.vocab_size:
        raise ValueError(f"contrastive amateur {amateur.model_id!r}: vocab_size {width}, but the expert "
                         f"{engine.loaded.model_id!r} has {engine.vocab_size}; the amateur must share the tokenizer")
    ours, theirs = getattr(engine.loaded.vocab, "fingerprint", None), getattr(amateur.vocab, "fingerprint", None)
    if ours and theirs and ours != theirs:
        raise ValueError(f"contrastive amateur {amateur.model_id!r}: its tokenizer differs from the expert's "
                         f"{engine.loaded.model_id!r} (fingerprints differ); the amateur must share the tokenizer")


def _check_request(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, watermark) -> None:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    params.validate_for_vocab(engine.vocab_size)
    if params.mirostat_mode:
        raise ValueError(f"contrastive decoding with SamplingParams.mirostat_mode={params.mirostat_mode}: "
                         "mirostat adapts to the model's surprise, which contrastive scores are not; use top-k/top-p")
    if params.constraint is not None:
        raise ValueError("contrastive decoding with SamplingParams.constraint: not supported; use plain decoding")
    if not prompt_ids or not all(isinstance(t, int) and 0 <= t < engine.vocab_size for t in prompt_ids):
        raise ValueError(f"prompt: expected a non-empty list of token ids in [0, {engine.vocab_size})")
    if len(prompt_ids) >= engine.max_model_len:
        raise ValueError(f"prompt: {len(prompt_ids)} tokens, but max_model_len={engine.max_model_len} leaves no room")
    check_watermark_vocab(engine, watermark)


@torch.inference_mode()
def run_contrastive(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, config: ContrastiveConfig,
                    watermark: Watermark | None = None) -> list[RequestOutput]:
    """Decode ``prompt_ids`` by contrastive decoding with the engine's model as expert; returns one output.

    Honours max_new_tokens, min_new_tokens, EOS (unless ignore_eos), stop_token_ids, stop strings;
    penalties, logit bias and bans act on the expert's logits before the plausibility cut, the
    watermark where ``config.watermark_before_cut`` puts it. ``logprobs`` and ``cumulative_logprob``
    (their sum) are the expert's penalised log-probabilities before the watermark, as the engine
    reports. ``decoding_stats`` counts the steps where CD chose differently from the expert's argmax
    and the mean size of the plausible set."""
    if not isinstance(config, ContrastiveConfig):
        raise TypeError(f"config must be ContrastiveConfig, got {type(config).__name__}")
    prompt_ids = list(prompt_ids)
    _check_request(engine, prompt_ids, params, watermark)
    amateur = _amateur_for(engine, config)
    check_shared_tokenizer(engine, amateur)
    pipeline = engine.pipeline
    expert_lm, amateur_lm = CachedLM(engine.model), CachedLM(amateur.model)
    state = SamplerState(params, prompt_ids, engine.eos_token_ids)
    text = TextTracker(engine.tokenizer, params.stop)
    stop_ids = set(params.stop_token_ids or ())
    room = engine.max_model_len - len(prompt_ids)
    output: list[int] = []
    logprobs: list[float] | None = [] if params.logprobs is not None else None
    top_logprobs: list[list[tuple[int, float]]] | None = [] if params.logprobs is not None else None
    cumulative, overrides, plausible_total = 0.0, 0, 0
    finish_reason = "length"
    while True:
        expert_logits, amateur_logits = expert_lm.logits(state.history, 1), amateur_lm.logits(state.history, 1)
        rows = StepRows.of([state], [watermark])  # the watermark's context, once per step
        expert = pipeline.penalise(expert_logits, rows)
        expert_logp = expert.log_softmax(-1)  # reported logprobs: before the watermark, as the engine's
        cut_logp = expert_logp
        if watermark is not None and config.watermark_before_cut:
            cut_logp = pipeline.watermark_(expert, rows).log_softmax(-1)
        amateur_logp = (amateur_logits / config.amateur_temperature).log_softmax(-1)
        scores = contrastive_scores(cut_logp, amateur_logp, config.alpha, config.beta)
        plausible_total += int(torch.isfinite(scores).sum())
        if watermark is not None and not config.watermark_before_cut:
            pipeline.watermark_(scores, rows)  # a hard list covering all of V_head leaves the step unbiased
        token = int(pipeline.choose(scores, rows)[0])
        chosen_logp = float(expert_logp[0, token])
        cumulative += chosen_logp
        overrides += int(token != int(expert_logp[0].argmax()))
        if logprobs is not None:
            logprobs.append(chosen_logp)
            k = min(params.logprobs, expert_logp.shape[1])
            values, ids = expert_logp[0].topk(k) if k else (torch.empty(0), torch.empty(0, dtype=torch.long))
            top_logprobs.append(list(zip(ids.tolist(), values.tolist())))
        state.append(token)
        output.append(token)
        if (token in engine.eos_token_ids and not params.ignore_eos) or token in stop_ids:
            finish_reason = "stop"
            text.update(output[:-1], final=True)  # the stop token stays in token_ids, not in the text
            break
        if text.update(output):
            finish_reason = "stop"
            break
        if len(output) >= params.max_new_tokens or len(output) >= room:
            text.update(output, final=True)
            break

    return [request_output(
        f"contrastive-{next(_request_ids)}", prompt_ids, output, text.text, finish_reason, watermark, OutputDetails(
        logprobs=logprobs, top_logprobs=top_logprobs, cumulative_logprob=cumulative,
        stats={
            "method": "contrastive",
            "amateur": amateur.model_id,
            "alpha": config.alpha,
            "beta": config.beta,
            "expert_argmax_overrides": overrides,
            "mean_plausible_tokens": plausible_total / len(output),
        }),
    )]
