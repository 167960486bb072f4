"""LogitsPipeline: the one path from a step's logits [B, V] to one token per row, for every decoding method.

Stages, in order; each runs only on the rows that use it, and a row with a stage off is left
bit-for-bit untouched:

1. constraint mask   -inf outside each constrained row's allowed set (generation.constraints.masks)
2. penalties         repetition (CTRL, over prompt + generated), presence / frequency (OpenAI, generated)
3. logit bias        added in the penalties' sparse scatter, so before the bans
4. bans              -inf on no-repeat n-grams, bad words, EOS / stop ids before min_new_tokens
                     (a ban always wins: a +inf bias on a banned token stays -inf, never NaN)
   -- reported logprobs are read here: before the watermark, so they do not reveal green lists --
5. watermark stage   each watermarked row's WatermarkStage (stage.py, every hook declared there): the KGW bias transforms
                     the logits; a sampler stage (Gumbel-max, SynthID tournament: sampling_stage.py)
                     chooses in stage 8, over the distribution stages 6-7 leave.
                     A row's context (its last context_width tokens) is computed once per step (StepRows,
                     step_rows.py).
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

from dataclasses import dataclass

import torch

from generation.sample import sampler as sampling
from generation.sample.params import SamplerState
from generation.sample.sampler import (
    LN2,
    apply_bans_,
    apply_penalties_,
    apply_temperatures_,
    draw_,
    head_rows,
    mirostat_,
    rows_where,
    truncate_,
)
from generation.sample.step_rows import RowSubset, StepRows, restore_dead_rows_
from generation.sample.watermark_stage import stage_for
from watermark.text_kind import generated_as_code


@dataclass(slots=True)
class SampleOutput:
    token_ids: torch.Tensor  # LongTensor[B]
    logprobs: torch.Tensor | None  # FloatTensor[B], chosen token, pre-watermark; NaN for rows that did not ask
    top_logprobs: list[list[tuple[int, float]]] | None  # per row, [] for rows that did not ask
    ranking_logprobs: torch.Tensor | None = None  # [B, V] log-softmax after the watermark stage, when asked


class LogitsPipeline:
    """Turns logits [B, V] into one token per row, each row under its own SamplingParams, state and
    watermark (see the module docstring for the stages)."""

    def __init__(self, vocab_size: int, device, kind_table=None) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        # uint8 [V] of the tokens that read as code (watermark.text_kind.table_for): specs with a code_delta get it
        # on rows whose output reads as code; None: no row is read as code
        self.kind_table = kind_table

    # ---- stages 1-4 ----
    def penalise(self, logits: torch.Tensor, rows: StepRows, owned: bool = False) -> torch.Tensor:
        """Stages 1-4 on a float32 copy of ``logits`` (left untouched); returns the copy. ``owned``: the caller
        hands ``logits`` over (it never reads them again), so float32 logits are worked on in place, not copied."""
        if logits.dim() != 2 or logits.shape[0] != len(rows.states) or logits.shape[1] != self.vocab_size:
            raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(rows.states)} rows x vocab {self.vocab_size}")
        in_place = (owned and logits.dtype == torch.float32 and logits.is_contiguous()
                    and (not logits.is_inference() or torch.is_inference_mode_enabled()))
        scores = logits if in_place else logits.to(torch.float32, copy=True)
        rows.apply_constraint_(scores)
        apply_penalties_(scores, rows.states)
        apply_bans_(scores, rows.states)
        return scores

    # ---- stage 5 ----
    def watermark_(self, scores: torch.Tensor, rows: StepRows) -> torch.Tensor:
        """Stage 5 in place on penalised scores (and the dead-row fallbacks); returns scores."""
        rows.restore_constrained_(scores)
        marks = rows.watermarks
        if not any(m is not None for m in marks):
            return scores
        hard = [i for i, m in enumerate(marks) if m is not None and getattr(m.spec, "hard", False)]
        before = scores.index_select(0, self._index(hard)) if hard else None
        stages = [stage_for(m) if m is not None else None for m in marks]
        code = self.code_rows(rows)
        for stage in dict.fromkeys(s for s in stages if s is not None):
            served = marks if all(s is stage or s is None for s in stages) else \
                [m if s is stage else None for m, s in zip(marks, stages)]
            if code is not None and stage.reads_kind:
                stage.transform_(scores, rows.contexts, served, code)
            else:
                stage.transform_(scores, rows.contexts, served)
        if before is not None:
            restore_dead_rows_(scores, hard, before)
        return scores

    def code_rows(self, rows: StepRows) -> list[bool] | None:
        """Per row, whether its output so far reads as code (``watermark.text_kind.generated_as_code``); None where
        no row's spec has a code_delta or the pipeline has no kind table."""
        table = self.kind_table
        if table is None or not any(m is not None and getattr(m.spec, "code_delta", None) is not None
                                    for m in rows.watermarks):
            return None
        return [mark is not None and _reads_as_code(table, state) for state, mark in zip(rows.states, rows.watermarks)]

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
        apply_temperatures_(scores, params)
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

    def sample(self, logits: torch.Tensor, rows: StepRows, ranking: bool = False, owned: bool = False) -> SampleOutput:
        """All stages. Leaves ``logits`` untouched unless ``owned`` (the caller hands them over: the engine's
        step, which saves a [B, V] copy). Rows' tokens depend only on their own logits, params,
        state and generator, never on batch-mates. Reported logprobs are of the stage-4 logits;
        ``ranking`` also returns the stage-5 log-softmax (SampleOutput.ranking_logprobs)."""
        scores = self.penalise(logits, rows, owned)
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

    def _sample_rows(self, scores: torch.Tensor, sampled: torch.Tensor, states: list[SamplerState]) -> torch.Tensor:
        """Stages 6-8 for the plainly sampled rows (batch indices ``sampled``): their tokens, in that order."""
        batch = sampled.tolist()
        picked = [states[i] for i in batch]
        heads = head_rows([st.params for st in picked], self.vocab_size) if sampling.TOP_K_HEAD else []
        if not heads:  # no row has a top-k head: straight to the whole rows, nothing to split
            return self._sample_full_rows(scores, sampled, picked)
        subset = RowSubset(batch, sampled, picked)

        def on_heads(head_scores: torch.Tensor, heads: list[int]):
            served, tokens = sampling.sample_heads(head_scores, [picked[j].params for j in heads],
                                                   [picked[j].generator for j in heads])
            return [heads[j] for j in served], tokens

        def on_rest(rest: list[int]) -> torch.Tensor:
            return self._sample_full_rows(scores, subset.batch_index(rest), [picked[j] for j in rest])

        return self._heads_then_rest(scores, subset, heads, on_heads, on_rest)

    def _sample_full_rows(self, scores: torch.Tensor, rows: torch.Tensor, picked: list[SamplerState]) -> torch.Tensor:
        """Temperature, truncation or mirostat, and the draw over whole rows (batch indices ``rows``)."""
        sub, miro = self._shaped(scores, rows, picked)
        chosen = draw_(sub.softmax(-1), [st.generator for st in picked])
        if miro is not None:
            _record_surprise(miro, chosen, picked)
        return chosen

    def _heads_then_rest(self, scores: torch.Tensor, subset: RowSubset, heads: list[int], on_heads, on_rest
                         ) -> torch.Tensor:
        """One token per row of ``subset``, in its order. The local rows ``heads`` (top-k rows) go to
        ``on_heads(their scores, heads) -> (served, tokens)``, which serves those whose head holds every token
        the full path keeps (sampling.sample_heads: the same tokens, far faster); the rest, to
        ``on_rest(rest) -> tokens`` over whole rows of the vocabulary."""
        if not heads:
            return on_rest(list(range(len(subset))))
        chosen = torch.empty(len(subset), dtype=torch.long, device=scores.device)
        # every row a head (the vLLM plugin's usual step): no [B, V] copy
        head_scores = scores if len(heads) == scores.shape[0] else scores.index_select(0, subset.batch_index(heads))
        served, tokens = on_heads(head_scores, heads)
        if served:
            chosen[torch.tensor(served, device=scores.device)] = tokens
        rest = sorted(set(range(len(subset))) - set(served))
        if rest:
            chosen[torch.tensor(rest, device=scores.device)] = on_rest(rest)
        return chosen

    @staticmethod
    def _shaped(scores: torch.Tensor, rows: torch.Tensor, picked: list[SamplerState]):
        """Stages 6-7 over whole rows (batch indices ``rows``): (the rows, a copy unless every row is picked; the
        mirostat rows with their pre-truncation log-softmax, for the surprise as the paper's code, or None)."""
        params = [st.params for st in picked]
        sub = scores.index_select(0, rows) if rows.numel() < scores.shape[0] else scores
        apply_temperatures_(sub, params)
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
        """Sampled rows whose watermark stage chooses: stages 6-7 here, then the stage's own choice (a choosing
        stage owns its rows' randomness). Rows with top-k whose stage takes candidates get 6-7 on their head only
        (sampling.head_distributions: the same survivors, far faster than a full-vocabulary top-p sort)."""
        batch = [i for i, s in enumerate(staged) if s]
        subset = RowSubset(batch, self._index(batch), [rows.states[i] for i in batch])

        def on_heads(head_scores: torch.Tensor, heads: list[int]):
            got, probs, ids = sampling.head_distributions(head_scores, [subset.states[j].params for j in heads])
            served = [heads[g] for g in got]
            return served, self._choose_by_stage(probs, ids, rows, subset, served) if served else None

        def on_rest(rest: list[int]) -> torch.Tensor:
            picked = [subset.states[j] for j in rest]
            sub, miro = self._shaped(scores, subset.batch_index(rest), picked)
            chosen = self._choose_by_stage(sub.softmax(-1), None, rows, subset, rest)
            if miro is not None:  # mirostat's mu follows the surprise of the token the stage chose
                _record_surprise(miro, chosen, picked)
            return chosen

        heads = [j for j in head_rows(subset.params, self.vocab_size)
                 if stage_for(rows.watermarks[batch[j]]).takes_candidates] \
            if sampling.TOP_K_HEAD else []
        tokens[subset.index] = self._heads_then_rest(scores, subset, heads, on_heads, on_rest)

    def _choose_by_stage(self, probs: torch.Tensor, candidates: torch.Tensor | None, rows: StepRows,
                         subset: RowSubset, local: list[int]) -> torch.Tensor:
        """Each stage's tokens for the local rows ``local`` of ``subset`` (row j of ``probs`` is local row
        local[j]); ``candidates`` [R, C]: the token ids of probs' columns (None: the whole vocabulary)."""
        got = torch.empty(len(local), dtype=torch.long, device=probs.device)
        groups: dict[int, tuple[object, list[int]]] = {}
        for j, row in enumerate(local):
            stage = stage_for(rows.watermarks[subset.batch[row]])
            groups.setdefault(id(stage), (stage, []))[1].append(j)
        for stage, members in groups.values():
            index = torch.tensor(members, dtype=torch.long, device=probs.device)
            whole = len(members) == probs.shape[0]
            served = probs if whole else probs.index_select(0, index)
            batch = [subset.batch[local[j]] for j in members]
            args = ([rows.contexts[i] for i in batch], [rows.watermarks[i] for i in batch],
                    [subset.states[local[j]].generator for j in members])
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


def _reads_as_code(table, state: SamplerState) -> bool:
    """The running count of codeish generated tokens, kept on the state (each token looked up once)."""
    upto, codeish = state.kind_count
    history = state.history
    if len(history) > upto:
        codeish += int(table.take(history[upto:], mode="clip").sum())
        state.kind_count = (len(history), codeish)
    return generated_as_code(codeish, len(history) - state.prompt_len)


def _record_surprise(miro, chosen: torch.Tensor, picked: list[SamplerState]) -> None:
    """Mirostat rows' surprise (bits) of the token drawn: applied to mu when the caller accepts it."""
    rows, logp = miro
    surprise = (-logp.gather(1, chosen[rows][:, None])[:, 0] / LN2).tolist()
    for j, s in zip(rows.tolist(), surprise):
        picked[j].pending_surprise = (int(chosen[j]), s)
