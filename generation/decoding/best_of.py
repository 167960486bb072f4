"""``n`` / ``best_of`` sampling: best_of sibling samples of one prompt, the n most likely returned.

The siblings run as one batch over the engine's own KV cache (``engine.branches``: the prompt computed once,
its blocks shared by every sibling, a finished sibling's blocks given back at once) and are
drawn by the engine's own LogitsPipeline, each with its own generator: sibling 0 uses ``params.seed`` itself (so
n = best_of = 1 reproduces the engine's seeded output), sibling i > 0 a seed derived from (seed, i).
Without a seed the base seed is fresh OS randomness and results are not reproducible.

Ranking: ``cumulative_logprob`` is the sum, over a sibling's tokens, of the token's log-probability under
the *processed* distribution: penalties, logit bias and bans, then the watermark bias, at temperature 1
and before truncation (the same scoring as beam search; temperature and truncation only shape the draw).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets

from generation.decoding.beam import ends_on_token
from generation.decoding.engine_interface import DecodingEngine, generation_room
from generation.sample import StepRows
from generation.sample.sampler import SamplerState, SamplingParams
from generation.sequence import OutputDetails, RequestOutput, TextTracker, request_output
from watermark.scheme import Watermark

SEED_SPACE = 2**63  # torch.Generator.manual_seed takes any int below 2**64; stay in signed range


def sibling_seed(base: int, index: int) -> int:
    """Sibling ``index``'s seed: the base seed itself for sibling 0, else a hash of (base, index)."""
    if index == 0:
        return base
    digest = hashlib.sha256(f"provmark-best-of:{base}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_SPACE


def check_best_of_params(params: SamplingParams, best_of: int) -> None:
    if best_of > 1 and params.greedy:
        raise ValueError(f"n/best_of={best_of} samples with SamplingParams.temperature={params.temperature}: greedy siblings would all be "
                         "identical; sample (temperature > 0) or use beam search")
    if params.constraint is not None:  # the engine's path (n = best_of = 1) is the one that follows constraints
        raise ValueError("SamplingParams.constraint with n/best_of sampling: not supported")


class _Sibling:
    __slots__ = ("index", "logprob", "logprobs", "reason", "state", "text", "top_logprobs")

    def __init__(self, index: int, state: SamplerState, text: TextTracker) -> None:
        self.index, self.state, self.text = index, state, text
        self.logprob = 0.0
        self.logprobs: list[float] | None = [] if state.params.logprobs is not None else None
        self.top_logprobs: list | None = [] if state.params.logprobs is not None else None
        self.reason: str | None = None


def run_best_of(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, n: int, best_of: int,
                watermark: Watermark | None = None) -> list[RequestOutput]:
    """Sample ``best_of`` siblings; the ``n`` with the highest cumulative_logprob, best first.

    Stops as the engine does (EOS unless ignore_eos, stop tokens, stop strings, max_new_tokens);
    ``logprobs`` are reported per token as the engine reports them."""
    if isinstance(n, bool) or not isinstance(n, int) or isinstance(best_of, bool) or not isinstance(best_of, int) \
            or not 1 <= n <= best_of:
        raise ValueError(f"n={n!r}, best_of={best_of!r}: need ints with 1 <= n <= best_of")
    check_best_of_params(params, best_of)
    max_new = generation_room(engine, prompt_ids, params)
    eos = engine.eos_token_ids
    base = params.seed if params.seed is not None else secrets.randbits(63)
    siblings = [_Sibling(i, SamplerState(dataclasses.replace(params, seed=sibling_seed(base, i)), prompt_ids, eos),
                         TextTracker(engine.tokenizer, params.stop)) for i in range(best_of)]
    with engine.branches(prompt_ids, best_of, max_new, cache_lookup=params.seed is None) as runner:
        logits = runner.prefill().expand(best_of, -1)
        live = list(siblings)
        while live:
            states = [s.state for s in live]
            # ranked by the log-softmax after the watermark, before temperature and truncation
            sampled = engine.pipeline.sample(logits, StepRows.of(states, [watermark] * len(states)), ranking=True)
            tokens = sampled.token_ids.tolist()
            chosen = sampled.ranking_logprobs.gather(1, sampled.token_ids[:, None])[:, 0].tolist()
            still = []
            for row, (sib, token) in enumerate(zip(live, tokens)):
                sib.state.append(token)
                sib.logprob += chosen[row]
                if sib.logprobs is not None:
                    sib.logprobs.append(float(sampled.logprobs[row]))
                    sib.top_logprobs.append(sampled.top_logprobs[row])
                sib.reason = _stop_reason(sib, token, params, eos, max_new)
                if sib.reason is None:
                    still.append(row)
            if not still:
                break
            if len(still) < len(live):
                runner.reorder(still)
            live = [live[row] for row in still]
            logits = runner.step([tokens[row] for row in still])

    ranked = sorted(siblings, key=lambda s: s.logprob, reverse=True)[:n]
    return [_output(rank, sib, prompt_ids, params, eos, watermark, best_of) for rank, sib in enumerate(ranked)]


def _stop_reason(sib: _Sibling, token: int, params: SamplingParams, eos: set[int], max_new: int) -> str | None:
    """The engine's stop order: stop token, then stop string, then length."""
    if ends_on_token(token, params, eos):
        return "stop"
    if sib.text.update(sib.state.generated):
        return "stop"
    if sib.state.num_generated >= max_new:
        return "length"
    return None


def _output(rank: int, sib: _Sibling, prompt_ids: list[int], params: SamplingParams, eos: set[int],
            watermark, best_of: int) -> RequestOutput:
    ids = sib.state.generated
    on_token = sib.reason == "stop" and ids and ends_on_token(ids[-1], params, eos)
    sib.text.update(ids[:-1] if on_token else ids, final=True)  # as Engine._finish: the stop token has no text
    return request_output(f"best_of-{rank}", prompt_ids, ids, sib.text.text, sib.reason, watermark,
                          OutputDetails(cumulative_logprob=sib.logprob, logprobs=sib.logprobs,
                                        top_logprobs=sib.top_logprobs, stats={"sibling": sib.index, "best_of": best_of}))

