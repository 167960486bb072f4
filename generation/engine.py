"""Engine: submit / step / generate / stream over an HF causal LM with our own cache and batching.

Each ``step()`` reads as three verbs: the scheduler picks a batch (new prompts to prefill, or every
running sequence for one decode token), the runner runs the model over the paged cache, and the
post-processing samples, appends, checks stops and reports outputs. ``submit`` may be called from any
thread; ``step`` is serialised by a lock (one thread drives the engine).

Post-processing is the LogitsPipeline (generation/sample/pipeline.py): constraint mask, penalties,
logit bias, bans, the watermark stage, temperature, truncation, the draw. Constrained requests
(``SamplingParams.constraint``) get their masks computed on a background thread while the model runs.

Advanced decoding (generation/decoding) runs over this engine's public surface: ``prompt_ids``,
``branches`` (continuations of one prompt over this engine's KV pool, generation/branches.py), ``model``
(the plain weights), ``tokenizer``, ``eos_token_ids``, ``max_model_len``, ``pipeline`` and ``generate``.
The engine never imports decoding: ``decode`` calls the method object it is handed.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from collections.abc import Sequence as Seq

import torch
from tqdm import tqdm

from generation.block_manager import BlockManager
from generation.branches import BranchRunner
from generation.constraints.constraint import (
    ConstraintCompiler,
    ConstraintError,
    ConstraintMasks,
    start_masks,
)
from generation.cpu import native
from generation.kv_cache import DEFAULT_BLOCK_SIZE, CacheConfig, default_cache_tokens
from generation.models import LoadedModel, load_model
from generation.runner import ComputePaths, ModelRunner
from generation.sample import LogitsPipeline, StepRows
from generation.sample.sampler import SamplerState, SamplingParams
from generation.sample.sampling_stage import check_request
from generation.sample.top_head import set_top_head_backend
from generation.scheduler import Batch, Scheduler, SchedulerConfig
from generation.sequence import (
    OutputDetails,
    RequestOutput,
    Sequence,
    TextTracker,
    request_output,
)
from watermark.field_error import FieldError
from watermark.greenlist import set_bias_backend
from watermark.gumbel import set_survivors_backend
from watermark.scheme import Watermark
from watermark.synthid import set_tournament_backend
from watermark.text_kind import table_for

LONG_JOB_PROMPTS = 16  # generate() shows a progress bar from this many prompts on (use_tqdm=None)


class Engine:
    """Continuous-batching generation engine.

    ``Engine(model=None)`` loads the embedded default model. ``max_num_seqs`` sequences run at once,
    each up to ``max_model_len`` tokens (prompt + output); ``max_cache_tokens`` sizes the paged KV pool
    (blocks of ``block_size`` tokens; default: every sequence at full length, capped by a share of the free
    memory: generation/kv_cache.py); excess sequences wait or are preempted and recomputed. ``prefix_caching``
    lets a prompt reuse the cached blocks of a prefix computed before (generation/block_manager.py).
    ``paths`` (``ComputePaths``) picks the compute paths: ``packed_weights`` runs the model through
    oneDNN-packed linear weights (generation/cpu/packed_linear.py;
    None = when the machine supports it; the loaded model itself is left untouched); ``native_kernels``
    runs decode attention, RMSNorm and silu * up on the C++ kernels (generation/cpu/native.py; None = when
    they build); ``block_table_attention`` and ``cuda_graphs`` are the CUDA decode path (generation/gpu/;
    None = on CUDA); ``int8_weights`` (opt-in) runs every linear on int8 weights (generation/runner.py).
    """

    def __init__(self, model: LoadedModel | None = None, *, max_num_seqs: int = 16, max_model_len: int = 2048,
                 max_cache_tokens: int | None = None, max_prefill_tokens: int = 8192,
                 block_size: int = DEFAULT_BLOCK_SIZE, prefix_caching: bool = True,
                 paths: ComputePaths = ComputePaths()) -> None:
        if model is None:
            model = load_model()
        self.loaded = model
        self.tokenizer = model.vocab.tokenizer
        self.vocab_size = int(model.model.config.vocab_size)
        position_limit = getattr(model.model.config, "max_position_embeddings", None)
        if position_limit is not None and max_model_len > position_limit:
            raise ValueError(f"max_model_len={max_model_len}: the model's positions stop at {position_limit}")
        if max_cache_tokens is None:
            max_cache_tokens = default_cache_tokens(model.model, max_num_seqs, max_model_len)
        self.config = SchedulerConfig(max_num_seqs, max_model_len, max_cache_tokens, max_prefill_tokens)
        cache_config = CacheConfig.for_tokens(self.config.max_cache_tokens, max_model_len, block_size)
        self.runner = ModelRunner(model.model, cache_config, packed_weights=paths.packed_weights,
                                  native_kernels=paths.native_kernels,
                                  block_table_attention=paths.block_table_attention, cuda_graphs=paths.cuda_graphs,
                                  int8_weights=paths.int8_weights)
        if self.runner.native_attention:
            # the watermark bias on the C++ kernel too: same integers, without torch.compile's per-call
            # overhead (about half of the bias's 0.4 ms a step); process-wide, exact, CPU float32 only
            set_bias_backend(native.watermark_bias)
            set_survivors_backend(native.gumbel_survivors)  # the Gumbel race's pruning pass, same integers
            set_top_head_backend(native.top_head)  # top-k heads: sampled top-k rows, SynthID's tournament
            set_tournament_backend(native.synthid_tournament)  # SynthID's layers over a head, same bits
        self.scheduler = Scheduler(self.config, BlockManager(cache_config.num_blocks, cache_config.block_size,
                                                             prefix_caching), pads_prefill=not self.runner.flat_prefill)
        self.pipeline = LogitsPipeline(self.vocab_size, self.runner.device,
                                       table_for(self.tokenizer, self.vocab_size, model.vocab.fingerprint))
        self.eos_token_ids = self._eos_ids(model)
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
        ValueError (generation.constraints.constraint.ConstraintError) before anything is queued; a
        sampling watermark (gumbel, synthid) with a greedy request raises SamplingWatermarkError."""
        prompt_ids = self.prompt_ids(prompt)
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate_for_vocab(self.vocab_size)
        constraint = self.constraint_compiler().compile(params.constraint) if params.constraint is not None else None
        if watermark is not None and getattr(watermark, "vocab_size", self.vocab_size) != self.vocab_size:
            raise FieldError("watermark", f"built for vocab_size {watermark.vocab_size}, model has {self.vocab_size}")
        check_request(watermark, params)  # a sampling watermark cannot serve greedy requests: refused here
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

    @property
    def max_model_len(self) -> int:
        """Tokens a sequence may hold, prompt and output together."""
        return self.config.max_model_len

    @property
    def model(self) -> torch.nn.Module:
        """The loaded causal LM itself (plain weights), for callers running it over their own cache."""
        return self.loaded.model

    def prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """A prompt (text, tokenized with special tokens, or token ids) as checked token ids: non-empty,
        in the vocabulary, leaving room to generate. ValueError / TypeError naming the problem."""
        if isinstance(prompt, str):
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise FieldError("prompt", f"token ids {bad[:5]} outside [0, {self.vocab_size})")
        else:
            raise TypeError("prompt must be a str or a list of int token ids")
        if not ids:
            raise FieldError("prompt", "empty (no tokens)")
        if len(ids) >= self.config.max_model_len:
            raise FieldError("prompt", f"{len(ids)} tokens, but max_model_len={self.config.max_model_len} leaves no room to "
                             "generate")
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
            batch_rows = batch.sampled  # _run's row order
            pending = start_masks([seq.constraint for seq in batch_rows], self.vocab_size)
            rows, logits = self._run(batch)
            if not rows:  # prompt chunks only: no token this step
                if pending is not None:
                    pending.result()
                return finished
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
                parts.append(self.runner.prefill([seq.all_ids[seq.num_cached:] for seq in group],
                                                 [seq.num_cached for seq in group],
                                                 [seq.block_table for seq in group]))
                rows.extend(group)
            self.scheduler.computed(rows)
            return rows, torch.cat(parts) if len(parts) > 1 else parts[0]
        rows = batch.sampled
        tokens = [seq.all_ids[-1] for seq in batch.decode]
        positions = [seq.num_tokens - 1 for seq in batch.decode]
        tables = [seq.block_table for seq in batch.decode]
        pick = list(range(len(batch.decode)))
        for seq, n in batch.chunks:  # each prompt token of a chunk is one more row (it sees the rows before it)
            tokens += seq.all_ids[seq.num_cached:seq.num_cached + n]
            positions += range(seq.num_cached, seq.num_cached + n)
            tables += [seq.block_table] * n
            if seq.num_cached + n == seq.num_tokens:  # the prompt's last token: its logits give the first token
                pick.append(len(tokens) - 1)
        logits = self.runner.decode(torch.tensor(tokens, dtype=torch.long, device=self.runner.device), positions,
                                    tables, pick if len(pick) < len(tokens) else None)
        self.scheduler.computed(batch.decode, batch.chunks)
        return rows, logits

    def branches(self, prompt_ids: list[int], n_branches: int, max_new: int, cache_lookup: bool = True) -> BranchRunner:
        """``n_branches`` continuations of one prompt (beams, siblings) over this engine's KV pool: the prompt
        prefilled once (prefix-cached blocks reused) and shared by reference, each step one decode of the
        engine's runner. Use it as a context manager: leaving it gives the blocks back (generation/branches.py)."""
        return BranchRunner(self.runner, self.scheduler.blocks, self._step_lock, prompt_ids, n_branches, max_new,
                            cache_lookup)

    def _postprocess(self, rows: list[Sequence], logits: torch.Tensor,
                     masks: ConstraintMasks | None = None) -> list[RequestOutput]:
        step = StepRows.of([seq.sampler_state for seq in rows], [seq.watermark for seq in rows], masks)
        sampled = self.pipeline.sample(logits, step, owned=True)  # the step's logits are read nowhere else
        counts = step.allowed_counts
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
        return request_output(
            seq.request_id, seq.prompt_ids, seq.output_ids, seq.text.text, seq.finish_reason, seq.watermark,
            OutputDetails(text_delta=delta, finished=seq.is_finished, logprobs=seq.logprobs,
                          top_logprobs=seq.top_logprobs, forced_positions=seq.forced_positions, error=seq.error))

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
        """Decode one prompt (str or token ids, as submit) with an advanced method: ``decoding`` is a
        generation.decoding.DecodingParams (beam search, n/best_of, speculative, contrastive or MBR), which
        runs itself over this engine (``decoding.run(engine, prompt, params, watermark)``); None = plain
        generation. See generation.decoding.run_decoding for what is returned and raised."""
        if decoding is None:
            return self.generate([prompt], params, watermarks=[watermark], use_tqdm=False)
        run = getattr(decoding, "run", None)
        if not callable(run):
            raise TypeError(f"decoding must be DecodingParams or None, got {type(decoding).__name__}")
        return run(self, prompt, params, watermark)
