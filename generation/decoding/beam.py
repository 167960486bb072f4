"""Beam search over the engine's model, with the watermark bias applied to every beam's logits.

Scoring: a beam's score is the sum, over its tokens, of log_softmax of the *processed* logits (the
engine's LogitsPipeline up to its watermark stage: the request's penalties, logit bias and bans, then
the watermark bias computed from that beam's own history).
No temperature and no truncation: beam search is deterministic. So ``temperature`` must be 0 or 1 (the
greedy and the sampler defaults; ignored either way), and the sampling-only options (top-k/p, min-p,
typical, epsilon, eta, mirostat) are refused rather than silently dropped.

Length penalty and early stopping follow transformers' beam search semantics (read in its source,
``GenerationMixin._beam_search``): at each step the top ``2 * num_beams`` continuations are ranked;
those ending the sequence (EOS / stop token / stop string / the length limit) and ranked among the top
``num_beams`` join the finished set with score ``sum / generated_length ** length_penalty``; the best
``num_beams`` that do not end carry on. The search stops when ``early_stopping=True`` and ``num_beams``
sequences are finished, or (False / "never") once the best running beam cannot beat the worst finished
one: judged at the current length (False), or at the maximum length when length_penalty > 0 ("never":
exact). The beams run over the engine's own KV cache (``engine.branches``): the prompt is computed once and
every beam reads its blocks; picking the next beams re-points block tables, it never copies keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from generation.decoding.engine_interface import DecodingEngine, generation_room
from generation.sample import StepRows
from generation.sample.sampler import SamplerState, SamplingParams
from generation.sequence import OutputDetails, RequestOutput, request_output
from watermark.scheme import Watermark

CANDIDATES_PER_BEAM = 2  # transformers keeps 2 x num_beams candidates so num_beams survive even if all top ones end
SAMPLING_ONLY = {  # SamplingParams field: its "off" value; beam search has no draw for these to shape
    "top_k": 0, "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
}


@dataclass(slots=True)
class BeamConfig:
    """Beam search: ``num_beams`` hypotheses; ``length_penalty`` exponent on the generated length
    (> 0 favours longer outputs); ``early_stopping`` True | False | "never" (see module docstring)."""

    num_beams: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def __post_init__(self) -> None:
        if isinstance(self.num_beams, bool) or not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(f"BeamConfig.num_beams={self.num_beams!r}: must be an int >= 1")
        lp = self.length_penalty
        if isinstance(lp, bool) or not isinstance(lp, (int, float)) or not math.isfinite(lp):
            raise ValueError(f"BeamConfig.length_penalty={lp!r}: must be a finite number")
        if not (self.early_stopping is True or self.early_stopping is False or self.early_stopping == "never"):
            raise ValueError(f"BeamConfig.early_stopping={self.early_stopping!r}: must be True, False or 'never'")


def check_beam_params(params: SamplingParams) -> None:
    """Refuse SamplingParams beam search cannot honour (ValueError naming both settings)."""
    if params.mirostat_mode != 0:
        raise ValueError(f"SamplingParams.mirostat_mode={params.mirostat_mode} with beam search: "
                         "mirostat shapes random draws; beam search makes none")
    if not params.greedy and params.temperature != 1.0:
        raise ValueError(f"SamplingParams.temperature={params.temperature} with beam search: beam search is "
                         "deterministic and scores temperature-1 log-probabilities; use 0 or 1")
    for field, off in SAMPLING_ONLY.items():
        if getattr(params, field) != off:
            raise ValueError(f"SamplingParams.{field}={getattr(params, field)} with beam search: "
                             "truncation only shapes random draws; beam search makes none")
    if params.constraint is not None:
        raise ValueError("SamplingParams.constraint with beam search: not supported")
    if params.logprobs is not None:
        raise ValueError("SamplingParams.logprobs with beam search: not supported (see cumulative_logprob)")


# ---- shared with best_of: stop checks, the replayed state ----

def ends_on_token(token: int, params: SamplingParams, eos_ids: set[int]) -> bool:
    """EOS (unless ignore_eos) or a stop token: the sequence ends with this token."""
    return (token in eos_ids and not params.ignore_eos) or token in (params.stop_token_ids or ())


def decode_text(tokenizer, token_ids: list[int], params: SamplingParams, eos_ids: set[int]) -> tuple[str, bool]:
    """(output text, a stop string ended it): the ending stop token is left out, text cut before a stop string."""
    ids = token_ids[:-1] if token_ids and ends_on_token(token_ids[-1], params, eos_ids) else token_ids
    text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    hits = [i for i in (text.find(s) for s in params.stop or ()) if i >= 0]
    return (text[:min(hits)], True) if hits else (text, False)


def replay_state(params: SamplingParams, prompt_ids: list[int], generated: list[int], eos_ids: set[int]) -> SamplerState:
    """A fresh SamplerState that has seen ``generated`` (a forked beam's own penalty/ban history)."""
    state = SamplerState(params, prompt_ids, eos_ids)
    for token in generated:
        state.append(token)
    return state


# ---- the search ----

@dataclass(slots=True)
class _Hypothesis:
    score: float  # length-penalised: what beams are ranked by
    logprob: float  # raw sum of token logprobs
    token_ids: list[int]
    reason: str


def run_beam(engine: DecodingEngine, prompt_ids: list[int], params: SamplingParams, config: BeamConfig,
             watermark: Watermark | None = None, n: int = 1) -> list[RequestOutput]:
    """The ``n`` best finished beams, best first (n <= num_beams; fewer only if fewer could finish).

    Each output's ``cumulative_logprob`` is its raw score (sum of processed log-probabilities);
    ``decoding_stats`` holds ``beam_score`` (the length-penalised score beams are ranked by),
    ``num_beams`` and ``steps`` (search steps run before it stopped). Honours max_new_tokens, min_new_tokens,
    EOS/ignore_eos, stop token ids, stop strings, penalties, bans and logit bias; refuses sampling-only settings (see check_beam_params)."""
    if not 1 <= n <= config.num_beams:
        raise ValueError(f"n={n}: must be in [1, BeamConfig.num_beams={config.num_beams}]")
    check_beam_params(params)
    max_new = generation_room(engine, prompt_ids, params)
    eos = engine.eos_token_ids
    num_beams, lp = config.num_beams, float(config.length_penalty)
    tokenizer = engine.tokenizer
    with engine.branches(prompt_ids, num_beams, max_new, cache_lookup=params.seed is None) as runner:
        logits = runner.prefill()
        states = [SamplerState(params, prompt_ids, eos)]
        beam_scores = torch.zeros(1)
        finished: list[_Hypothesis] = []
        can_improve = True  # transformers' early-stop heuristic (sticky once it says no)

        steps = 0
        for length in range(1, max_new + 1):
            steps = length
            logp = engine.pipeline.ranking_logprobs(logits, StepRows.of(states, [watermark] * len(states)))
            vocab = logp.shape[1]
            totals = (logp + beam_scores[:, None]).reshape(-1)
            keep = min(CANDIDATES_PER_BEAM * num_beams, totals.shape[0])
            values, flat = totals.topk(keep)
            may_finish = can_improve and not (config.early_stopping is True and len(finished) >= num_beams)
            survivors: list[tuple[int, int, float]] = []  # (parent beam, token, score)
            for rank, (value, index) in enumerate(zip(values.tolist(), flat.tolist())):
                if value == float("-inf"):
                    break
                parent, token = divmod(index, vocab)
                generated = states[parent].generated + [token]
                reason = None
                if ends_on_token(token, params, eos) or (params.stop and decode_text(tokenizer, generated, params, eos)[1]):
                    reason = "stop"
                elif length >= max_new:
                    reason = "length"
                if reason is None:
                    if len(survivors) < num_beams:
                        survivors.append((parent, token, value))
                elif rank < num_beams and may_finish:  # only the top num_beams candidates may finish (as transformers)
                    finished.append(_Hypothesis(value / length ** lp, value, generated, reason))
            finished.sort(key=lambda h: h.score, reverse=True)
            del finished[num_beams:]
            if not survivors:
                break
            if len(finished) >= num_beams:
                best_length = max_new if config.early_stopping == "never" and lp > 0.0 else length
                best_possible = survivors[0][2] / best_length ** lp
                can_improve = can_improve and best_possible > finished[-1].score
                if config.early_stopping is True or not can_improve:
                    break
            states = _fork_states(states, survivors, params, prompt_ids, eos)
            beam_scores = torch.tensor([score for _, _, score in survivors])
            runner.reorder([parent for parent, _, _ in survivors])
            logits = runner.step([token for _, token, _ in survivors])

    outputs = []
    for i, hyp in enumerate(finished[:n]):
        text, _ = decode_text(tokenizer, hyp.token_ids, params, eos)
        outputs.append(request_output(f"beam-{i}", prompt_ids, hyp.token_ids, text, hyp.reason, watermark,
                                      OutputDetails(cumulative_logprob=hyp.logprob,
                                                    stats={"beam_score": hyp.score, "num_beams": num_beams,
                                                           "steps": steps})))
    return outputs


def _fork_states(states: list[SamplerState], survivors: list[tuple[int, int, float]], params: SamplingParams,
                 prompt_ids: list[int], eos: set[int]) -> list[SamplerState]:
    """Each survivor's state: its parent's plus its token. A parent's state object goes to its last child;
    earlier children get a replayed copy (penalty counts and n-gram bans are per beam)."""
    last_child = {parent: i for i, (parent, _, _) in enumerate(survivors)}
    forked = []
    for i, (parent, token, _) in enumerate(survivors):
        source = states[parent]
        state = source if last_child[parent] == i else replay_state(params, prompt_ids, source.generated, eos)
        forked.append(state)
    for state, (_, token, _) in zip(forked, survivors):
        state.append(token)
    return forked
