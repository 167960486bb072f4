"""Speculative decoding: a cheap drafter proposes k tokens, the target checks them in one forward pass.

Each round: the drafter proposes up to k tokens; one target forward over the uncached tail plus the
drafts gives the target's logits at every drafted position and one past; each position's processed
distribution (the engine's LogitsPipeline, watermark included, see speculative_positions) verifies the drafts
left to right (speculative_verify); the accepted drafts plus one replacement or bonus token are
committed, and both caches are cropped back to the committed prefix. Sampled outputs are distributed
exactly as the engine's (watermarked) target; greedy outputs equal plain greedy decoding token for token,
and so do sampled outputs under a sampling watermark (gumbel, synthid: verified by replay, verify.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from generation.decoding.engine_interface import DecodingEngine, check_watermark_vocab
from generation.decoding.speculative.cache import CachedLM
from generation.decoding.speculative.drafters import (
    ModelDrafter,
    PromptLookupDrafter,
    load_draft_model,
)
from generation.decoding.speculative.positions import RequestPositions
from generation.decoding.speculative.verify import verify_round, verify_round_greedy, verify_round_replay
from generation.sample.sampler import SamplingParams
from generation.sequence import OutputDetails, RequestOutput, TextTracker, request_output
from watermark.scheme import Watermark

METHODS = ("prompt_lookup", "draft")
MAX_SPECULATIVE_TOKENS = 64  # beyond this a rejected round wastes more than any acceptance rate repays
_request_ids = itertools.count()


def _fail(field: str, value: object, rule: str) -> None:
    raise ValueError(f"SpeculativeConfig.{field}={value!r}: {rule}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    ``method`` "prompt_lookup" drafts by copying what followed the most recent earlier occurrence of
    the last n-gram (n from ``prompt_lookup_max`` down to ``prompt_lookup_min``); "draft" drafts with
    ``draft_model`` (a local HF model folder, or "default" for the embedded model) sharing the target's
    tokenizer. ``num_speculative_tokens`` tokens are drafted per target forward."""

    method: str = "prompt_lookup"
    num_speculative_tokens: int = 5
    prompt_lookup_max: int = 3
    prompt_lookup_min: int = 1
    draft_model: str | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            _fail("method", self.method, f"must be one of {', '.join(METHODS)}")
        if not _is_int(self.num_speculative_tokens) or not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            _fail("num_speculative_tokens", self.num_speculative_tokens, f"must be an int in [1, {MAX_SPECULATIVE_TOKENS}]")
        if not _is_int(self.prompt_lookup_min) or self.prompt_lookup_min < 1:
            _fail("prompt_lookup_min", self.prompt_lookup_min, "must be an int >= 1")
        if not _is_int(self.prompt_lookup_max) or self.prompt_lookup_max < self.prompt_lookup_min:
            _fail("prompt_lookup_max", self.prompt_lookup_max, "must be an int >= prompt_lookup_min")
        if self.method == "draft":
            if not isinstance(self.draft_model, str) or not self.draft_model.strip():
                _fail("draft_model", self.draft_model, "method 'draft' needs a model folder (or 'default')")
        elif self.draft_model is not None:
            _fail("draft_model", self.draft_model, "only used with method 'draft'")


def check_params(params: SamplingParams) -> None:
    """ValueError naming the setting when ``params`` asks for something speculative decoding cannot
    reproduce exactly."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
    if params.mirostat_mode != 0:
        raise ValueError(f"SamplingParams.mirostat_mode={params.mirostat_mode} cannot be combined with "
                         "SpeculativeConfig: mirostat's target surprise moves after every token, so drafted "
                         "positions have no fixed distribution to verify against")
    if params.constraint is not None:
        raise ValueError("SamplingParams.constraint cannot be combined with SpeculativeConfig: "
                         "constrained generation runs in the engine (Engine.generate)")


def make_drafter(engine: DecodingEngine, config: SpeculativeConfig):
    if config.method == "prompt_lookup":
        return PromptLookupDrafter(config.prompt_lookup_max, config.prompt_lookup_min)
    return ModelDrafter(load_draft_model(config.draft_model, engine.loaded))


def run_speculative(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, config: SpeculativeConfig,
                    watermark: Watermark | None = None) -> list[RequestOutput]:
    """Generate one completion of ``prompt_ids`` by speculative decoding; a one-element list.

    The output has the target's distribution under ``params`` (and ``watermark``): token-identical to
    the engine's greedy output when temperature is 0. ``decoding_stats`` reports the drafter, tokens
    proposed and accepted, the acceptance rate (None when nothing was proposed) and target forwards.
    Mirostat and constraints raise ValueError."""
    if not isinstance(config, SpeculativeConfig):
        raise TypeError(f"config must be SpeculativeConfig, got {type(config).__name__}")
    check_params(params)
    return [speculative_decode(engine, prompt_ids, params, make_drafter(engine, config),
                               config.num_speculative_tokens, watermark)]


def _check_prompt(engine: DecodingEngine, prompt_ids: list[int]) -> list[int]:
    if not isinstance(prompt_ids, (list, tuple)) or not all(_is_int(t) for t in prompt_ids):
        raise TypeError("prompt_ids must be a list of int token ids")
    ids = list(prompt_ids)
    bad = [t for t in ids if not 0 <= t < engine.vocab_size]
    if bad:
        raise ValueError(f"prompt_ids: token ids {bad[:5]} outside [0, {engine.vocab_size})")
    if not ids:
        raise ValueError("prompt_ids: empty (no tokens)")
    if len(ids) >= engine.max_model_len:
        raise ValueError(f"prompt_ids: {len(ids)} tokens, but max_model_len={engine.max_model_len} "
                         "leaves no room to generate")
    return ids


def speculative_decode(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, drafter,
                       num_speculative_tokens: int, watermark: Watermark | None = None) -> RequestOutput:
    """The loop behind ``run_speculative`` with any drafter (speculative_drafters.NoDrafter: plain decoding)."""
    check_params(params)
    prompt_ids = _check_prompt(engine, prompt_ids)
    params.validate_for_vocab(engine.vocab_size)
    check_watermark_vocab(engine, watermark)
    positions = RequestPositions(engine.pipeline, params, prompt_ids, engine.eos_token_ids, watermark)
    target = CachedLM(engine.model)
    run = _Run(engine, params, positions)
    limit = min(params.max_new_tokens, engine.max_model_len - len(prompt_ids))
    proposed = accepted_total = 0
    while run.finish_reason is None:
        history = positions.history
        room = limit - len(run.output_ids) - 1  # the round always adds one target token after the drafts
        drafts, q_rows = drafter.propose(history, min(num_speculative_tokens, room), positions) if room > 0 else ([], None)
        logits = target.logits(history + drafts, keep=len(drafts) + 1)
        rows = positions.rows([drafts[:j] for j in range(len(drafts) + 1)])
        penalised = positions.penalised(logits, rows)
        logp = penalised.log_softmax(-1) if params.logprobs is not None else None  # reported before the watermark
        dists = positions.distributions(penalised, rows)
        if params.greedy:
            accepted, token = verify_round_greedy(dists, drafts)
        elif positions.replays:
            accepted, token = verify_round_replay(
                lambda j: positions.choice(dists[j], rows, j, positions.generator), drafts)
        else:
            accepted, token = verify_round(dists, q_rows, drafts, positions.generator)
        proposed += len(drafts)
        accepted_total += accepted
        committed = len(history) + accepted  # the new token's keys/values come with the next forward
        target.crop_to(committed)
        drafter.rollback(committed)
        for j, new in enumerate(drafts[:accepted] + [token]):
            run.append(new, logp[j] if logp is not None else None)
            if run.finish_reason is not None:
                break  # accepted tokens past a stop are dropped
    stats = {
        "drafter": drafter.name,
        "proposed": proposed,
        "accepted": accepted_total,
        "acceptance_rate": accepted_total / proposed if proposed else None,
        "target_forwards": target.forwards,
    }
    return run.output(prompt_ids, watermark, stats)


class _Run:
    """The committed output of one request: tokens, logprobs, text and the stop checks (as the engine's)."""

    def __init__(self, engine: DecodingEngine, params: SamplingParams, positions: RequestPositions) -> None:
        self.engine, self.params, self.positions = engine, params, positions
        self.output_ids: list[int] = []
        self.logprobs: list[float] | None = [] if params.logprobs is not None else None
        self.top_logprobs: list[list[tuple[int, float]]] | None = [] if params.logprobs is not None else None
        self.text = TextTracker(engine.tokenizer, params.stop)
        self.finish_reason: str | None = None

    def append(self, token: int, logp_row) -> None:
        params = self.params
        self.positions.commit(token)
        self.output_ids.append(token)
        if self.logprobs is not None and logp_row is not None:
            self.logprobs.append(float(logp_row[token]))
            values, ids = logp_row.topk(min(params.logprobs, logp_row.shape[0]))
            self.top_logprobs.append(list(zip(ids.tolist(), values.tolist())))
        stop_token = (token in self.engine.eos_token_ids and not params.ignore_eos) or token in (params.stop_token_ids or ())
        if stop_token:
            self.finish_reason = "stop"
            self.text.update(self.output_ids[:-1], final=True)  # the stop token stays in token_ids, not in the text
            return
        if self.text.update(self.output_ids):
            self.finish_reason = "stop"
        elif (len(self.output_ids) >= params.max_new_tokens
              or len(self.positions.history) >= self.engine.max_model_len):
            self.finish_reason = "length"
        if self.finish_reason is not None:
            self.text.update(self.output_ids, final=True)

    def output(self, prompt_ids: list[int], watermark, stats: dict) -> RequestOutput:
        return request_output(f"spec-{next(_request_ids)}", prompt_ids, self.output_ids, self.text.text,
                              self.finish_reason, watermark,
                              OutputDetails(text_delta=self.text.take_delta(final=True), logprobs=self.logprobs,
                                            top_logprobs=self.top_logprobs, stats=stats))
