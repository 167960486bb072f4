"""LogitsPipeline: the one path from a step's logits [B, V] to one token per row, for every decoding method.

Stages, in order; each runs only on the rows that use it, and a row with a stage off is left
bit-for-bit untouched:

1. constraint mask   -inf outside each constrained row's allowed set (generation.constraints.masks)
2. penalties         repetition (CTRL, over prompt + generated), presence / frequency (OpenAI, generated)
3. logit bias        added in the penalties' sparse scatter, so before the bans
4. bans              -inf on no-repeat n-grams, bad words, EOS / stop ids before min_new_tokens
                     (a ban always wins: a +inf bias on a banned token stays -inf, never NaN)
   -- reported logprobs are read here: before the watermark, so they do not reveal green lists --
5. watermark stage   each watermarked row's WatermarkStage (watermark_stage.py): the KGW bias transforms
                     the logits; a sampler stage (Gumbel-max, SynthID tournament: sampling_stage.py)
                     chooses in stage 8, over the distribution stages 6-7 leave.
                     A row's context (its last context_width tokens) is computed once per step (StepRows).
6. temperature       divide, clamped to the float range (sampling.apply_temperature_: the one clamp)
7. truncation        top-k, top-p, min-p, typical, epsilon, eta; or mirostat
8. sample            greedy argmax; a uniform from the row's own generator (inverse CDF); or the stage's choice

A constrained row left with no finite logit by stages 2-5 gets its stage-1 logits back (the constraint
wins); a row a hard watermark would leave with none keeps its stage-4 logits (unwatermarked this step).
Rows with top-k run stages 6-8 on a head of their top_k (+ spare) tokens (sampling.sample_heads): the
same tokens as over the whole vocabulary, far faster.

Decoding methods call the groups they need: ``sample`` (all: the engine, n/best_of, MBR through the
engine), ``ranking_logprobs`` (1-5 then log-softmax: beam search), ``penalise`` + ``watermark_`` +
``choose`` (contrastive: its scores between 5 and 6), ``penalise`` + ``watermark_`` + ``probabilities``
(6-7 then softmax: speculative draft and verify).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from generation.constraints.masks import ConstraintMasks
from generation.sample import sampler as sampling
from generation.sample.params import SamplerState
from generation.sample.sampler import (
    LN2,
    apply_bans_,
    apply_penalties_,
    apply_temperature_,
    draw_,
    head_rows,
    mirostat_,
    rows_where,
    truncate_,
)
from generation.sample.sampling_stage import check_request, is_sampling_mark, row_context
from generation.sample.watermark_stage import stage_for
from watermark.scheme import Watermark

NEG_INF = float("-inf")


@dataclass(slots=True)
class SampleOutput:
    token_ids: torch.Tensor  # LongTensor[B]
    logprobs: torch.Tensor | None  # FloatTensor[B], chosen token, pre-watermark; NaN for rows that did not ask
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, [] for rows that did not ask
    ranking_logprobs: torch.Tensor | None = None  # [B, V] log-softmax after the watermark stage, when asked


@dataclass(slots=True)
class StepRows:
    """What one step knows about its rows: each row's sampler state (parameters, history, generator),
    watermark and context, and the step's constraint masks. Build with ``StepRows.of``."""

    states: list[SamplerState]
    watermarks: list[Watermark | None]
    contexts: list[list[int]]  # a watermarked row's last context_width tokens (at least 1); [] elsewhere
    constraint: ConstraintMasks | None = None
    # rows whose sampling watermark sits this position out (short or repeated context): the plain draw;
    # None when no row has a sampling watermark
    unmarked: list[bool] | None = None
    allowed_counts: list[int | None] | None = None  # from the constraint mask, per row
    _masked: torch.Tensor | None = field(default=None, repr=False)  # constrained rows after stage 1

    @classmethod
    def of(cls, states: Sequence[SamplerState], watermarks: Sequence[Watermark | None] | None = None,
           constraint: ConstraintMasks | None = None,
           histories: Sequence[Sequence[int]] | None = None) -> StepRows:
        """Rows for one step. ``histories`` overrides the token history a row's watermark context is
        read from (a drafted position past its state's history); by default the state's own."""
        states = list(states)
        marks = list(watermarks) if watermarks is not None else [None] * len(states)
        if len(marks) != len(states) or (histories is not None and len(histories) != len(states)):
            raise ValueError(f"StepRows: {len(states)} states, {len(marks)} watermarks"
                             + (f", {len(histories)} histories" if histories is not None else ""))
        contexts: list[list[int]] = []
        unmarked: list[bool] | None = None
        for i, mark in enumerate(marks):
            if mark is None:
                contexts.append([])
                continue
            history = histories[i] if histories is not None else states[i].history
            if is_sampling_mark(mark):  # the sampler is the watermark: greedy fails closed here too
                check_request(mark, states[i].params)
                context, marked = row_context(mark, states[i], history)
                contexts.append(context)
                unmarked = unmarked if unmarked is not None else [False] * len(marks)
                unmarked[i] = not marked
                continue
            width = max(mark.context_width, 1)  # the stage only reads the last context_width tokens
            contexts.append(list(history[max(0, len(history) - width):]))
        return cls(states, marks, contexts, constraint, unmarked=unmarked)

    @property
    def params(self):
        return [st.params for st in self.states]


class LogitsPipeline:
    """Turns logits [B, V] into one token per row, each row under its own SamplingParams, state and
    watermark (see the module docstring for the stages)."""

    def __init__(self, vocab_size: int, device) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)

    # ---- stages 1-4 ----
    def penalise(self, logits: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Stages 1-4 on a float32 copy of ``logits`` (left untouched); returns the copy."""
        if logits.dim() != 2 or logits.shape[0] != len(rows.states) or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(rows.states)} rows x vocab {self.vocab_size}")
        scores = logits.to(torch.float32, copy=True)
        if rows.constraint is not None:
            rows.allowed_counts = rows.constraint.apply_(scores)
            if rows.constraint.rows:  # what a row stripped bare by stages 2-5 falls back to
                rows._masked = scores.index_select(0, self._index(rows.constraint.rows))
        apply_penalties_(scores, rows.states)
        apply_bans_(scores, rows.states)
        return scores

    # ---- stage 5 ----
    def watermark_(self, scores: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Stage 5 in place on penalised scores (and the dead-row fallbacks); returns scores."""
        constrained = rows.constraint.rows if rows.constraint is not None else []
        if constrained:
            _restore_dead_rows_(scores, constrained, rows._masked)
        marks = rows.watermarks
        if not any(m is not None for m in marks):
            return scores
        hard = [i for i, m in enumerate(marks) if m is not None and getattr(m.spec, "hard", False)]
        before = scores.index_select(0, self._index(hard)) if hard else None
        stages = [stage_for(m) if m is not None else None for m in marks]
        for stage in dict.fromkeys(s for s in stages if s is not None):
            served = marks if all(s is stage or s is None for s in stages) else \
                [m if s is stage else None for m, s in zip(marks, stages)]
            stage.transform_(scores, rows.contexts, served)
        if before is not None:
            _restore_dead_rows_(scores, hard, before)
        return scores

    def ranking_logprobs(self, logits: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """log-softmax after stages 1-5 (temperature 1, no truncation): what beam search and best_of rank by."""
        return self.watermark_(self.penalise(logits, rows), rows).log_softmax(-1)

    # ---- stages 6-7 ----
    def probabilities(self, scores: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Softmax after stages 6-7 of watermarked scores, in place: the distribution stage 8 draws from
        (speculative verification). Every row must sample (not greedy) without mirostat."""
        params = rows.params
        if any(p.greedy or p.mirostat_mode for p in params):
            raise ValueError("probabilities: greedy and mirostat rows have no fixed distribution to return")
        self._temperature_and_truncation_(scores, params)
        return scores.softmax(-1)

    def _temperature_and_truncation_(self, scores: torch.Tensor, params) -> None:
        if any(p.temperature != 1.0 for p in params):
            apply_temperature_(scores, torch.tensor([p.temperature for p in params], device=scores.device)[:, None])
        truncate_(scores, params)

    # ---- stage 8 (with 6-7) ----
    def choose(self, scores: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Stages 6-8 on watermarked scores [B, V] (modified in place): one token per row, LongTensor [B].
        Of the states it only records mirostat rows' pending surprise (append() accepts a token)."""
        states = rows.states
        params = rows.params
        tokens = torch.empty(len(states), dtype=torch.long, device=scores.device)
        greedy = rows_where([p.greedy for p in params], scores.device)
        if greedy is not None:  # max(dim) gives argmax's first maximal index, several times faster on CPU
            tokens[greedy] = (scores if greedy.numel() == len(states) else scores.index_select(0, greedy)).max(-1).indices
        unmarked = rows.unmarked or [False] * len(states)
        staged = [not p.greedy and m is not None and not off and stage_for(m).chooses_tokens
                  for p, m, off in zip(params, rows.watermarks, unmarked)]
        sampled = rows_where([not p.greedy and not s for p, s in zip(params, staged)], scores.device)
        if sampled is not None:
            tokens[sampled] = self._sample_rows(scores, sampled, states)
        if any(staged):
            self._stage_choices(scores, rows, staged, tokens)
        return tokens

    def sample(self, logits: torch.Tensor, rows: StepRows, ranking: bool = False) -> SampleOutput:
        """All stages. Leaves ``logits`` untouched. Rows' tokens depend only on their own logits, params,
        state and generator, never on batch-mates. Reported logprobs are of the stage-4 logits;
        ``ranking`` also returns the stage-5 log-softmax (SampleOutput.ranking_logprobs)."""
        scores = self.penalise(logits, rows)
        params = rows.params
        lp_rows = rows_where([p.logprobs is not None for p in params], scores.device)
        logp = scores.index_select(0, lp_rows).log_softmax(-1) if lp_rows is not None else None
        self.watermark_(scores, rows)
        ranked = scores.log_softmax(-1) if ranking else None
        tokens = self.choose(scores, rows)
        out = self._output(tokens, logp, lp_rows, params)
        out.ranking_logprobs = ranked
        return out

    # ---- internals ----
    def _index(self, rows: list[int]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _sample_rows(self, scores: torch.Tensor, rows: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
        picked = [states[i] for i in rows.tolist()]
        heads = head_rows([st.params for st in picked], self.vocab_size) if sampling.TOP_K_HEAD else []
        if not heads:
            return self._sample_full_rows(scores, rows, picked)
        chosen = torch.empty(len(picked), dtype=torch.long, device=scores.device)
        head_global = rows[torch.tensor(heads, device=rows.device)]
        head_scores = scores if head_global.numel() == scores.shape[0] else scores.index_select(0, head_global)
        served, tokens = sampling.sample_heads(head_scores, [picked[j].params for j in heads],
                                               [picked[j].generator for j in heads])
        served = [heads[j] for j in served]
        if served:
            chosen[torch.tensor(served, device=scores.device)] = tokens
        rest = sorted(set(range(len(picked))) - set(served))
        if rest:
            rest_at = torch.tensor(rest, device=scores.device)
            chosen[rest_at] = self._sample_full_rows(scores, rows[rest_at], [picked[j] for j in rest])
        return chosen

    def _sample_full_rows(self, scores: torch.Tensor, rows: torch.Tensor, picked: list[SamplerState]) -> torch.Tensor:
        """Temperature, truncation or mirostat, and the draw over whole rows of the vocabulary."""
        sub, miro = self._shaped(scores, rows, picked)
        chosen = draw_(sub.softmax(-1), [st.generator for st in picked])
        if miro is not None:
            _record_surprise(miro, chosen, picked)
        return chosen

    @staticmethod
    def _shaped(scores: torch.Tensor, rows: torch.Tensor, picked: list[SamplerState]):
        """Stages 6-7 over whole rows: (the rows, a copy unless every row is picked; the mirostat rows
        with their pre-truncation log-softmax, for the surprise as the paper's code, or None)."""
        params = [st.params for st in picked]
        sub = scores.index_select(0, rows) if rows.numel() < scores.shape[0] else scores
        if any(p.temperature != 1.0 for p in params):
            apply_temperature_(sub, torch.tensor([p.temperature for p in params], device=sub.device)[:, None])
        plain = rows_where([p.mirostat_mode == 0 for p in params], sub.device)
        if plain is not None:
            sampling.on_rows_(sub, plain, lambda s: truncate_(s, [params[i] for i in plain.tolist()]))
        miro = rows_where([p.mirostat_mode != 0 for p in params], sub.device)
        if miro is None:
            return sub, None
        miro_logp = sub.index_select(0, miro).log_softmax(-1)
        mu = sampling.column([st.mirostat_mu for st in picked], miro)
        sampling.on_rows_(sub, miro, lambda s: mirostat_(s, [params[i].mirostat_mode for i in miro.tolist()], mu))
        return sub, (miro, miro_logp)

    def _stage_choices(self, scores: torch.Tensor, rows: StepRows, staged: list[bool], tokens: torch.Tensor) -> None:
        """Sampled rows whose watermark stage chooses: stages 6-7 here, then the stage's own choice. Rows
        with top-k whose stage takes candidates get 6-7 on their head only (sampling.head_distributions:
        the same survivors, far faster than a full-vocabulary top-p sort)."""
        at = [i for i, s in enumerate(staged) if s]
        picked = [rows.states[i] for i in at]
        marks = [rows.watermarks[i] for i in at]
        chosen = torch.empty(len(at), dtype=torch.long, device=scores.device)
        heads = [j for j in head_rows([st.params for st in picked], self.vocab_size)
                 if getattr(stage_for(marks[j]), "takes_candidates", False)] if sampling.TOP_K_HEAD else []
        served: list[int] = []
        if heads:
            head_at = [at[j] for j in heads]  # every row a head (the vLLM plugin's usual step): no [B, V] copy
            head_scores = scores if head_at == list(range(scores.shape[0])) else scores.index_select(0, self._index(head_at))
            got, probs, ids = sampling.head_distributions(head_scores, [picked[j].params for j in heads])
            served = [heads[g] for g in got]
            if served:
                chosen[self._index(served)] = self._choose_by_stage(probs, ids, served, rows, at, picked, marks)
        rest = [j for j in range(len(at)) if j not in set(served)]
        if rest:  # a choosing stage owns its rows' randomness
            rest_picked = [picked[j] for j in rest]
            sub, miro = self._shaped(scores, self._index([at[j] for j in rest]), rest_picked)
            got = self._choose_by_stage(sub.softmax(-1), None, rest, rows, at, picked, marks)
            if miro is not None:  # mirostat's mu follows the surprise of the token the stage chose
                _record_surprise(miro, got, rest_picked)
            chosen[self._index(rest)] = got
        tokens[self._index(at)] = chosen

    def _choose_by_stage(self, probs, candidates, local: list[int], rows: StepRows, at, picked, marks) -> torch.Tensor:
        """Each stage's tokens for rows ``local`` (row j of ``probs`` is staged row local[j]); ``candidates``
        [R, C] the token ids of probs' columns (None: the whole vocabulary)."""
        got = torch.empty(len(local), dtype=torch.long, device=probs.device)
        groups: dict[int, tuple[object, list[int]]] = {}
        for j, staged_row in enumerate(local):
            stage = stage_for(marks[staged_row])
            groups.setdefault(id(stage), (stage, []))[1].append(j)
        for stage, members in groups.values():
            index = torch.tensor(members, dtype=torch.long, device=probs.device)
            whole = len(members) == probs.shape[0]
            served = probs if whole else probs.index_select(0, index)
            args = ([rows.contexts[at[local[j]]] for j in members], [marks[local[j]] for j in members],
                    [picked[local[j]].generator for j in members])
            if candidates is None:
                got[index] = stage.choose(served, *args)
            else:
                got[index] = stage.choose(served, *args, candidates=candidates if whole else candidates.index_select(0, index))
        return got

    def staged_choice(self, probs: torch.Tensor, rows: StepRows, row: int, generator: torch.Generator) -> int:
        """Stage 8 alone for one row's probabilities [V] (after stages 6-7, ``probabilities``): the
        choosing stage's token, or the plain draw from ``generator`` (speculative verification: one
        position at a time, so a rejected draft's positions consume no randomness)."""
        mark = rows.watermarks[row]
        off = rows.unmarked is not None and rows.unmarked[row]
        if mark is None or off or not stage_for(mark).chooses_tokens:
            return int(draw_(probs[None], [generator])[0])
        return int(stage_for(mark).choose(probs[None], [rows.contexts[row]], [mark], [generator])[0])

    @staticmethod
    def _output(tokens, logp, lp_rows, params) -> SampleOutput:
        if logp is None:
            return SampleOutput(tokens, None, None)
        chosen = torch.full(tokens.shape, float("nan"), device=tokens.device)
        chosen[lp_rows] = logp.gather(1, tokens[lp_rows][:, None])[:, 0]
        top: list[list[tuple[int, float]]] = [[] for _ in params]
        for j, r in enumerate(lp_rows.tolist()):
            k = min(params[r].logprobs, logp.shape[1])
            if k:
                values, ids = logp[j].topk(k)
                top[r] = list(zip(ids.tolist(), values.tolist()))
        return SampleOutput(tokens, chosen, top)


def _record_surprise(miro, chosen: torch.Tensor, picked: list[SamplerState]) -> None:
    """Mirostat rows' surprise (bits) of the token drawn: applied to mu when the caller accepts it."""
    rows, logp = miro
    surprise = (-logp.gather(1, chosen[rows][:, None])[:, 0] / LN2).tolist()
    for j, s in zip(rows.tolist(), surprise):
        picked[j].pending_surprise = (int(chosen[j]), s)


def _restore_dead_rows_(scores: torch.Tensor, rows: list[int], source: torch.Tensor) -> None:
    """Rows of ``scores`` (batch indices ``rows``) with no finite logit left take their values from
    ``source`` (row j of source is batch row rows[j])."""
    index = torch.tensor(rows, dtype=torch.long, device=scores.device)
    dead = scores.index_select(0, index).amax(-1) == NEG_INF
    if not bool(dead.any()):
        return
    local = dead.nonzero()[:, 0]
    scores[index[local]] = source.index_select(0, local.to(source.device)).to(scores.dtype)
