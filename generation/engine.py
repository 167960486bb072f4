"""Engine: submit / step / generate / stream over an HF causal LM with our own cache and batching.

Each ``step()`` reads as three verbs: the scheduler picks a batch (new prompts to prefill, or every
running sequence for one decode token), the runner runs the model over the slot cache, and the
post-processing samples, appends, checks stops and reports outputs. ``submit`` may be called from any
thread; ``step`` is serialised by a lock (one thread drives the engine).

Constrained requests (``SamplingParams.constraint``) get their logits masked to the constraint's allowed
set before the sampler, so penalties, logit bias and the watermark only choose among allowed tokens; the
step's masks are computed on a background thread while the model runs. Rows without a constraint are
never touched.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

import torch

from generation import native
from generation.constraints import (
    ConstraintCompiler,
    ConstraintError,
    ConstraintMasks,
    start_masks,
)
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner
from generation.sampling import Sampler, SamplerState, SamplingParams
from generation.scheduler import Batch, Scheduler, SchedulerConfig
from generation.sequence import (
    RequestOutput,
    Sequence,
    TextTracker,
    Usage,
    WatermarkInfo,
)

if TYPE_CHECKING:
    from generation.models import LoadedModel
    from watermark.scheme import Watermark

LONG_JOB_PROMPTS = 16  # generate() shows a progress bar from this many prompts on (use_tqdm=None)


class Engine:
    """Continuous-batching generation engine.

    ``Engine(model=None)`` loads the embedded default model. ``max_num_seqs`` sequences run at once,
    each up to ``max_model_len`` tokens (prompt + output); ``max_cache_tokens`` optionally caps the
    tokens held in the cache at once (excess sequences wait or are preempted and recomputed).
    ``packed_weights`` runs the model through oneDNN-packed linear weights (generation/packed_linear.py;
    None = when the machine supports it; the loaded model itself is left untouched); ``native_kernels``
    runs decode attention, RMSNorm and silu * up on the C++ kernels (generation/native.py; None = when
    they build).
    """

    def __init__(self, model: LoadedModel | None = None, *, max_num_seqs: int = 16, max_model_len: int = 2048,
                 max_cache_tokens: int | None = None, max_prefill_tokens: int = 4096,
                 packed_weights: bool | None = None, native_kernels: bool | None = None) -> None:
        if model is None:
            from generation.models import load_model

            model = load_model()
        self.loaded = model
        self.tokenizer = model.vocab.tokenizer
        self.vocab_size = int(model.model.config.vocab_size)
        position_limit = getattr(model.model.config, "max_position_embeddings", None)
        if position_limit is not None and max_model_len > position_limit:
            raise ValueError(f"max_model_len={max_model_len}: the model's positions stop at {position_limit}")
        self.config = SchedulerConfig(max_num_seqs, max_model_len, max_cache_tokens, max_prefill_tokens)
        self.runner = ModelRunner(model.model, CacheConfig(max_num_seqs, max_model_len), packed_weights,
                                  native_kernels)
        if self.runner.native_attention:
            # the watermark bias on the C++ kernel too: same integers, without torch.compile's per-call
            # overhead (about half of the bias's 0.4 ms a step); process-wide, exact, CPU float32 only
            from watermark.greenlist import set_bias_backend

            set_bias_backend(native.watermark_bias)
        self.scheduler = Scheduler(self.config, self.runner.cache.move_slot)
        self.sampler = Sampler(self.vocab_size, self.runner.device)
        self.eos_token_ids = self._eos_ids(model)
        self._processor = None  # watermark.processor.WatermarkProcessor, made on first watermarked request
        self._compiler: ConstraintCompiler | None = None  # made on first constrained request (~0.5 s)
        self._compiler_lock = threading.Lock()
        self._inbox: list[Sequence] = []
        self._aborts: list[str] = []
        self._inbox_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._live: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._arrivals = itertools.count()

    @staticmethod
    def _eos_ids(model) -> set[int]:
        ids = set()
        if model.vocab.eos_token_id is not None:
            ids.add(int(model.vocab.eos_token_id))
        configured = getattr(getattr(model.model, "generation_config", None), "eos_token_id", None)
        if configured is not None:
            ids.update(int(i) for i in (configured if isinstance(configured, (list, tuple)) else [configured]))
        return ids

    # ------------------------------------------------------------------ requests in
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Prompt ids for a chat (``[{"role": ..., "content": ...}]``) by the tokenizer's own template."""
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(i) for i in ids]

    def submit(self, prompt: str | list[int], params: SamplingParams, watermark: Watermark | None = None,
               request_id: str | None = None) -> str:
        """Queue a request (thread-safe); it joins the running batch at a later step. Returns its id.

        A ``params.constraint`` is compiled here: a grammar this vocabulary cannot follow raises
        ValueError (generation.constraints.ConstraintError) before anything is queued."""
        prompt_ids = self._prompt_ids(prompt)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate_for_vocab(self.vocab_size)
        constraint = self.constraint_compiler().compile(params.constraint) if params.constraint is not None else None
        if watermark is not None and getattr(watermark, "vocab_size", self.vocab_size) != self.vocab_size:
            raise ValueError(f"watermark: built for vocab_size {watermark.vocab_size}, model has {self.vocab_size}")
        state = SamplerState(params, prompt_ids, self.eos_token_ids)
        with self._inbox_lock:
            rid = str(request_id) if request_id is not None else f"req-{next(self._ids)}"
            if rid in self._live or any(s.request_id == rid for s in self._inbox):
                raise ValueError(f"request_id {rid!r} is already in use")
            seq = Sequence(rid, prompt_ids, params, state, TextTracker(self.tokenizer, params.stop),
                           watermark=watermark, arrival=next(self._arrivals), constraint=constraint)
            if params.logprobs is not None:
                seq.logprobs, seq.top_logprobs = [], []
            self._inbox.append(seq)
        return rid

    def constraint_compiler(self) -> ConstraintCompiler:
        """The engine's one compiler (tokenizer converted on first use; grammars cached across requests)."""
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = ConstraintCompiler(self.tokenizer, self.vocab_size, sorted(self.eos_token_ids))
            return self._compiler

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"prompt: token ids {bad[:5]} outside [0, {self.vocab_size})")
        else:
            raise TypeError("prompt must be a str or a list of int token ids")
        if not ids:
            raise ValueError("prompt: empty (no tokens)")
        if len(ids) >= self.config.max_model_len:
            raise ValueError(f"prompt: {len(ids)} tokens, but max_model_len={self.config.max_model_len} leaves no room to generate")
        return ids

    def abort(self, request_id: str) -> None:
        """Stop a request at the next step; its last output has finish_reason 'abort'."""
        with self._inbox_lock:
            self._aborts.append(request_id)

    def has_unfinished(self) -> bool:
        with self._inbox_lock:
            return bool(self._inbox or self._aborts) or self.scheduler.has_unfinished()

    # ------------------------------------------------------------------ the step
    def step(self) -> list[RequestOutput]:
        """Run one batch; returns the outputs of requests that advanced or finished in it."""
        with self._step_lock:
            finished = self._take_inbox()
            batch = self.scheduler.schedule()
            if batch.is_empty:
                return finished
            # the masks depend only on each row's constraint state: computed while the model runs
            batch_rows = [seq for group in batch.prefill_groups for seq in group] or batch.decode  # _run's row order
            pending = start_masks([seq.constraint for seq in batch_rows], self.vocab_size)
            rows, logits = self._run(batch)
            masks = pending.result() if pending is not None else None
            return finished + self._postprocess(rows, logits, masks)

    def _take_inbox(self) -> list[RequestOutput]:
        with self._inbox_lock:
            new, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
        for seq in new:
            self._live[seq.request_id] = seq
            self.scheduler.add(seq)
        outputs = []
        for rid in aborts:
            seq = self._live.get(rid)
            if seq is not None and not seq.is_finished:
                outputs.append(self._finish(seq, "abort"))
        return outputs

    def _run(self, batch: Batch) -> tuple[list[Sequence], torch.Tensor]:
        if batch.prefill_groups:
            rows, parts = [], []
            for group in batch.prefill_groups:
                parts.append(self.runner.prefill(group[0].slot, [seq.all_ids for seq in group]))
                rows.extend(group)
            for seq in rows:
                seq.num_cached = seq.num_tokens
            return rows, torch.cat(parts) if len(parts) > 1 else parts[0]
        rows = batch.decode
        last = torch.tensor([seq.all_ids[-1] for seq in rows], dtype=torch.long, device=self.runner.device)
        positions = [seq.num_tokens - 1 for seq in rows]
        pos = torch.tensor(positions, dtype=torch.long, device=self.runner.device)
        longest = max(positions)
        logits = self.runner.decode(last, pos, longest + 1, ragged=min(positions) != longest)
        for seq in rows:
            seq.num_cached = seq.num_tokens
        return rows, logits

    def _watermark_hook(self, rows: list[Sequence], masked_logits: torch.Tensor, constrained: list[int]):
        """The sampler's hook after penalties and bans: keeps constrained rows sampleable, then the watermark.

        A constrained row left without a finite logit gets its masked logits back: by penalties or bans
        (the constraint wins), or by a hard watermark whose red list covers every allowed token (that row
        goes unwatermarked this step). Returns None when no row needs either."""
        marks = [seq.watermark for seq in rows]
        watermarked = any(m is not None for m in marks)
        if not watermarked and not constrained:
            return None
        processor = None
        if watermarked:
            if self._processor is None:
                from watermark.processor import WatermarkProcessor

                self._processor = WatermarkProcessor()
            processor = self._processor
        # the bias only reads each row's last context_width tokens
        histories = [seq.all_ids[len(seq.all_ids) - max(m.context_width, 1):] if m is not None else ()
                     for seq, m in zip(rows, marks)]
        hard_rows = [i for i in constrained if marks[i] is not None and getattr(marks[i].spec, "hard", False)]

        def hook(scores: torch.Tensor) -> torch.Tensor:
            if constrained:
                _restore_dead_rows_(scores, constrained, masked_logits)
            if processor is None:
                return scores
            before = scores[hard_rows] if hard_rows else None  # advanced indexing: a copy
            processor.apply(scores, histories, marks)
            if before is not None:
                _restore_dead_rows_(scores, hard_rows, before, source_rows_are_local=True)
            return scores

        return hook

    def _postprocess(self, rows: list[Sequence], logits: torch.Tensor,
                     masks: ConstraintMasks | None = None) -> list[RequestOutput]:
        counts = masks.apply_(logits) if masks is not None else None
        constrained = masks.rows if masks is not None else []
        hook = self._watermark_hook(rows, logits, constrained)
        sampled = self.sampler.sample(logits, [seq.sampler_state for seq in rows], hook)
        tokens = sampled.token_ids.tolist()
        chosen_logprobs = sampled.logprobs.tolist() if sampled.logprobs is not None else None
        outputs = []
        for i, (seq, token) in enumerate(zip(rows, tokens)):
            if counts is not None and counts[i] is not None:
                seq.record_allowed(counts[i])
            seq.sampler_state.append(token)
            seq.output_ids.append(token)
            if seq.logprobs is not None and chosen_logprobs is not None:
                seq.logprobs.append(chosen_logprobs[i])
                seq.top_logprobs.append(sampled.top_logprobs[i])
            outputs.append(self._advance(seq, token))
        return outputs

    def _advance(self, seq: Sequence, token: int) -> RequestOutput:
        """Stop checks for a just-appended token, then the request's output for this step."""
        params = seq.params
        constraint = seq.constraint
        if constraint is not None:
            failure = constraint.error  # a dead end: the mask allowed EOS alone so the row could end
            if failure is None:
                try:
                    constraint.advance(token)
                except ConstraintError as exc:
                    failure = str(exc)
            if failure is not None:
                return self._finish(seq, "error", error=f"constraint: {failure}")
        if (token in self.eos_token_ids and not params.ignore_eos) or token in (params.stop_token_ids or ()):
            return self._finish(seq, "stop")  # the stop token stays in token_ids, not in the text
        if constraint is not None and constraint.is_complete():
            return self._finish(seq, "stop")  # a full match: nothing but EOS could follow
        if seq.text.update(seq.output_ids):
            return self._finish(seq, "stop")
        if len(seq.output_ids) >= params.max_new_tokens or seq.num_tokens >= self.config.max_model_len:
            return self._finish(seq, "length")
        return self._output(seq, seq.text.take_delta(final=False))

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> RequestOutput:
        seq.finish_reason, seq.error = reason, error
        ids = seq.output_ids
        stopped_on_token = reason == "stop" and ids and (
            (ids[-1] in self.eos_token_ids and not seq.params.ignore_eos) or ids[-1] in (seq.params.stop_token_ids or ()))
        seq.text.update(ids[:-1] if stopped_on_token else ids, final=True)
        self.scheduler.finish(seq)
        self._live.pop(seq.request_id, None)
        return self._output(seq, seq.text.take_delta(final=True))

    def _output(self, seq: Sequence, delta: str) -> RequestOutput:
        wm = seq.watermark
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_ids,
            token_ids=list(seq.output_ids),
            text=seq.text.text,
            text_delta=delta,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            usage=Usage(len(seq.prompt_ids), len(seq.output_ids)),
            logprobs=list(seq.logprobs) if seq.logprobs is not None else None,
            top_logprobs=list(seq.top_logprobs) if seq.top_logprobs is not None else None,
            watermark=WatermarkInfo(wm.spec.format(), wm.key_id, wm.fingerprint) if wm is not None else None,
            forced_positions=list(seq.forced_positions),
            error=seq.error,
        )

    # ------------------------------------------------------------------ conveniences
    def generate(self, prompts: Seq[str | list[int]], params: SamplingParams | Seq[SamplingParams],
                 watermarks: Watermark | None | Seq[Watermark | None] = None,
                 use_tqdm: bool | None = None) -> list[RequestOutput]:
        """Run prompts to completion; finished outputs in input order. ``params`` and ``watermarks``
        are one for all prompts or one per prompt; a progress bar shows for long jobs (or on request)."""
        prompts = list(prompts)
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        marks = [watermarks] * len(prompts) if watermarks is None or not isinstance(watermarks, (list, tuple)) else list(watermarks)
        if len(params_list) != len(prompts) or len(marks) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(params_list)} params and {len(marks)} watermarks")
        ids = [self.submit(p, sp, wm) for p, sp, wm in zip(prompts, params_list, marks)]
        pending = set(ids)
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm or (use_tqdm is None and len(prompts) >= LONG_JOB_PROMPTS):
            from tqdm import tqdm

            bar = tqdm(total=len(prompts), desc="generate", unit="req")
        try:
            while pending:
                for out in self.step():
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            for rid in pending:  # interrupted: do not leave orphans running
                self.abort(rid)
        return [done[rid] for rid in ids]

    def stream(self, prompt: str | list[int], params: SamplingParams,
               watermark: Watermark | None = None) -> Iterator[str]:
        """Yield the request's text in stable pieces as it is generated (drives the engine itself).

        The pieces concatenate to the final text: never half a character, never part of a stop string.
        Closing the iterator early aborts the request.
        """
        rid = self.submit(prompt, params, watermark)
        finished = False
        try:
            while not finished:
                for out in self.step():
                    if out.request_id != rid:
                        continue
                    finished = out.finished
                    if out.text_delta:
                        yield out.text_delta
        finally:
            if not finished:
                self.abort(rid)

    def decode(self, prompt: str | list[int], params: SamplingParams, decoding=None,
               watermark: Watermark | None = None) -> list[RequestOutput]:
        """Decode one prompt (str or token ids, as submit) with an advanced method: beam search, n/best_of,
        speculative, contrastive or MBR (``decoding``: generation.decoding.DecodingParams; None = plain).

        Runs synchronously on the caller's thread with its own cache (plain n = 1 goes through
        ``generate``); see generation.decoding.run_decoding for what is returned and raised."""
        from generation.decoding import run_decoding

        return run_decoding(self, prompt, params, decoding, watermark)


def _restore_dead_rows_(scores: torch.Tensor, rows: list[int], source: torch.Tensor,
                        source_rows_are_local: bool = False) -> None:
    """Rows of ``scores`` (batch indices ``rows``) with no finite logit left take their values from
    ``source`` (indexed by batch index, or by position in ``rows`` when ``source_rows_are_local``)."""
    index = torch.tensor(rows, dtype=torch.long, device=scores.device)
    dead = scores.index_select(0, index).amax(-1) == float("-inf")
    if not bool(dead.any()):
        return
    local = dead.nonzero()[:, 0]
    take = local if source_rows_are_local else index[local]
    scores[index[local]] = source.index_select(0, take.to(source.device)).to(scores.dtype)
