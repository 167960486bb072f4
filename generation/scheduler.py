"""Continuous batching over the paged KV cache: waiting / running queues, admission, preemption.

Each running sequence holds a block table (generation/block_manager.py); blocks are taken as it grows,
``block_size`` tokens at a time. Admission needs a free place (``max_num_seqs``) and free blocks for the
prompt plus one token, beyond the blocks the running sequences need for their next token (so admission
does not force a preemption). With prefix caching, an admitted prompt first takes the cached blocks of its
longest known prefix and only the rest is prefilled; a prompt whose next uncached full block another
prompt admitted in the same step is about to compute waits one step and then finds it cached.

When the running sequences cannot all grow by one token, the newest one is preempted: its blocks are
freed and it goes back to the front of the waiting queue, to be recomputed from its tokens (its cached
blocks, if still there, found again) when admitted again. The pool holds at least one full sequence, so the oldest sequence
can always proceed: nothing ever fails for lack of cache.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from generation.block_manager import BlockManager
from generation.sequence import Sequence, SequenceStatus

# Prefill groups: padding a group of prompts to its longest costs compute; up to this fraction of
# wasted rows is accepted in exchange for batching (measured in benchmarks/engine_throughput.py).
PREFILL_PADDING_SLACK = 0.15
# Chunked prefill: prompt tokens a step computes beside running decodes, however many decode. With 16
# decoding rows on a 2-core Sapphire Rapids CPU, 8 more rows raise the step's time by about a third; 32 more by 2.5x.
MIN_CHUNK_TOKENS = 8
# ... and, past max_step_tokens decoding rows, up to this share of them: where a step's rows bind its time (past
# about 24 on 2 cores) a chunk of half the decodes makes the step at most about 1.5x, the bound a single arrival is
# held to, while a burst of prompts admitted behind a first prefill starts in a few dozen steps, not hundreds
# (64 arrivals of 105 tokens: 8 prompt tokens a step beside 39 decodes took 330 steps).
CHUNK_SHARE_OF_DECODES = 0.5


def chunk_budget(decodes: int, max_step_tokens: int) -> int:
    """Prompt tokens a step computes in chunks beside ``decodes`` decoding rows."""
    return max(MIN_CHUNK_TOKENS, max_step_tokens - decodes, int(decodes * CHUNK_SHARE_OF_DECODES))
# Prompts longer than this (uncached tokens) arriving while requests decode are prefilled in chunks: every
# prompt, so none stalls the running requests for a prefill-only step (a 200-token prompt prefilled whole
# beside 16 decodes made one gap between their tokens several times the usual; in chunks its p99 stays
# within 1.5x: benchmarks/engine_workloads.py, arrival_short). A seeded prompt is still prefilled whole.
CHUNKED_PREFILL_ABOVE = 0


@dataclass(slots=True)
class SchedulerConfig:
    """Batching limits, validated at the door."""

    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_cache_tokens: int | None = None  # None = max_num_seqs * max_model_len (never binding)
    max_prefill_tokens: int = 8192  # padded prompt tokens run in one prefill step
    # rows (decode tokens + prompt tokens of chunked prefills) one step runs while requests decode; a chunk
    # gets what the decodes leave, at least MIN_CHUNK_TOKENS (benchmarks/engine_workloads.py, arrival)
    max_step_tokens: int = 24

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_prefill_tokens", "max_step_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SchedulerConfig.{name}={value!r}: must be a positive int")
        if self.max_model_len < 2:
            raise ValueError(f"SchedulerConfig.max_model_len={self.max_model_len!r}: must be >= 2")
        if self.max_cache_tokens is None:
            self.max_cache_tokens = self.max_num_seqs * self.max_model_len
        elif isinstance(self.max_cache_tokens, bool) or not isinstance(self.max_cache_tokens, int):
            raise ValueError(f"SchedulerConfig.max_cache_tokens={self.max_cache_tokens!r}: must be an int or None")
        elif self.max_cache_tokens < self.max_model_len:
            raise ValueError(
                f"SchedulerConfig.max_cache_tokens={self.max_cache_tokens}: must be >= max_model_len "
                f"({self.max_model_len}) so one full sequence always fits"
            )


@dataclass(slots=True)
class Batch:
    """What one step runs: prompts to prefill (groups padded together), or the running sequences' next
    tokens (``decode``) with chunks of prompts being prefilled beside them (``chunks``: sequence, tokens)."""

    prefill_groups: list[list[Sequence]]
    decode: list[Sequence]
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.prefill_groups and not self.decode and not self.chunks

    @property
    def sampled(self) -> list[Sequence]:
        """The rows that get a token from this step, in the order the runner returns their logits."""
        if self.prefill_groups:
            return [seq for group in self.prefill_groups for seq in group]
        return self.decode + [seq for seq, n in self.chunks if seq.num_cached + n == seq.num_tokens]


class Scheduler:
    """Decides each step's batch, taking and freeing blocks through ``blocks``."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, pads_prefill: bool = True) -> None:
        """``pads_prefill``: the runner pads a prefill step's prompts to one length, so they are split into groups
        of similar lengths; False (a runner that runs their tokens alone, ``ModelRunner.flat_prefill``): one group."""
        self.config = config
        self.blocks = blocks
        self.pads_prefill = pads_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.num_preemptions = 0

    @property
    def tokens_held(self) -> int:
        """Cache positions the running sequences need once the next decode writes each row's last token."""
        return sum(seq.num_tokens for seq in self.running)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def schedule(self) -> Batch:
        """Admit waiting sequences that fit. Prompts are prefilled whole (a prefill step), except, while
        requests decode, an unseeded prompt (of more than CHUNKED_PREFILL_ABOVE uncached tokens): it is computed
        in chunks beside the decodes, oldest first, up to ``max_step_tokens`` rows a step in all (at least
        MIN_CHUNK_TOKENS prompt tokens). With nothing to prefill whole, decode every running sequence."""
        decoding = any(seq.num_cached == seq.num_tokens - 1 for seq in self.running)
        whole = self._admit(decoding)
        if not decoding:  # nothing to protect: prompts begun in chunks finish in one prefill
            whole += [seq for seq in self.running if seq.num_cached < seq.num_tokens - 1 and seq not in whole]
        if whole:
            # longest first puts similar lengths side by side, so the prefill groups come out fewer and
            # larger (12 -> 7 forwards for the benchmark's 16 prompts)
            whole.sort(key=lambda s: s.num_tokens - s.num_cached, reverse=True)
            return Batch(self._group_for_prefill(whole) if self.pads_prefill else [whole], [])
        self._make_room_to_grow()
        decode = [seq for seq in self.running if seq.num_tokens - seq.num_cached == 1]
        chunks, budget = [], chunk_budget(len(decode), self.config.max_step_tokens)
        for seq in self.running:
            left = seq.num_tokens - seq.num_cached
            if left > 1 and budget > 0:  # oldest first; the last token of a prompt is computed with the decodes
                take = min(left, budget)
                chunks.append((seq, take))
                budget -= take
        return Batch([], decode, chunks)

    def _admit(self, decoding: bool) -> list[Sequence]:
        """Move waiting sequences that fit into the running set, with their cached blocks and blocks for the
        rest; the ones to prefill whole now (``decoding``: the others are prefilled in chunks)."""
        cfg, blocks = self.config, self.blocks
        admitted: list[Sequence] = []
        held: list[Sequence] = []
        # leave every running row room for one more token, so admission does not force a preemption
        reserve = sum(blocks.missing(seq, seq.num_tokens + 1) for seq in self.running)
        # full prompt blocks that admitted sequences compute in this step: a prompt that would compute one of
        # them too is held back a step, then shares them (many requests with one system prompt at once)
        pending: set[bytes] = set()
        for seq in self.running:  # prompts still being prefilled in chunks
            if seq.num_cached < seq.num_tokens - 1:
                pending.update(blocks.hashes(seq, (seq.num_tokens - 1) // blocks.block_size)[
                    seq.num_cached // blocks.block_size:])
        prefill_tokens = 0
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            found = blocks.lookup(seq)
            first_new = blocks.uncomputed_hash(seq, len(found))
            if first_new is not None and first_new in pending:
                held.append(self.waiting.popleft())
                continue
            tail = seq.num_tokens - len(found) * blocks.block_size
            chunked = decoding and seq.cache_lookup and tail > CHUNKED_PREFILL_ABOVE
            if blocks.cost(seq, found, seq.num_tokens + 1) > blocks.num_free - reserve or (
                    admitted and not chunked and prefill_tokens + tail > cfg.max_prefill_tokens):
                break
            self.waiting.popleft()
            blocks.admit(seq, found)
            if first_new is not None:
                pending.update(blocks.hashes(seq, (seq.num_tokens - 1) // blocks.block_size)[len(found):])
            reserve += blocks.missing(seq, seq.num_tokens + 1)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if not chunked:
                admitted.append(seq)
                prefill_tokens += tail
        self.waiting.extendleft(reversed(held))  # in their order, ahead of the rest
        return admitted

    @staticmethod
    def _group_for_prefill(seqs: list[Sequence]) -> list[list[Sequence]]:
        """Runs of similar lengths (tokens left to compute) whose padding waste stays under the slack."""
        groups: list[list[Sequence]] = [[seqs[0]]]
        for seq in seqs[1:]:
            group = groups[-1]
            lengths = [s.num_tokens - s.num_cached for s in group] + [seq.num_tokens - seq.num_cached]
            if max(lengths) * len(lengths) <= (1 + PREFILL_PADDING_SLACK) * sum(lengths):
                group.append(seq)
            else:
                groups.append([seq])
        return groups

    def computed(self, rows: list[Sequence], chunks: list[tuple[Sequence, int]] = ()) -> None:
        """A step computed every token of ``rows`` but the newest and ``n`` more tokens of each chunk's
        sequence: their full blocks become findable."""
        for seq in rows:
            seq.num_cached = seq.num_tokens
            self.blocks.register(seq)
        for seq, n in chunks:
            seq.num_cached += n
            self.blocks.register(seq)

    def _make_room_to_grow(self) -> None:
        """Blocks for every running sequence's next token, preempting the newest while they run short."""
        for seq in list(self.running):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted below to make room for an older one
            while not self.blocks.grow(seq, seq.num_tokens):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's blocks; it waits at the front and is recomputed from its tokens."""
        self._release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence for good (finished or aborted), from whichever queue holds it."""
        if seq.status is SequenceStatus.RUNNING:
            self._release(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED

    def _release(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.blocks.release(seq)
