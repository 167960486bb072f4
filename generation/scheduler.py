"""Continuous batching over the slot cache: waiting / running queues, admission, preemption.

Running sequences always occupy slots ``0..n-1``, so a decode step reads the cache as one view.
When a sequence leaves from the middle, the one in the last slot moves into its slot (the engine
copies its cached keys/values). Admission needs a free slot and room in the token budget
(``max_cache_tokens``, which bounds cached tokens and hence attention work). When the running
sequences cannot all grow by one token within the budget, the one in the last slot (usually the
newest) is preempted: its slot is freed and it goes back to the front of the waiting queue, to be
recomputed from its tokens when admitted again. The budget holds at least one full sequence, so the
sequence in slot 0 can always proceed: nothing ever fails for lack of cache.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from generation.sequence import Sequence, SequenceStatus

# Prefill groups: padding a group of prompts to its longest costs compute; up to this fraction of
# wasted rows is accepted in exchange for batching (measured in benchmarks/engine_throughput.py).
PREFILL_PADDING_SLACK = 0.15


@dataclass(slots=True)
class SchedulerConfig:
    """Batching limits, validated at the door."""

    max_num_seqs: int = 16
    max_model_len: int = 2048
    max_cache_tokens: int | None = None  # None = max_num_seqs * max_model_len (never binding)
    max_prefill_tokens: int = 4096  # padded prompt tokens run in one prefill step

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_model_len", "max_prefill_tokens"):
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
    """What one step runs: prompts to prefill (groups padded together) or all running sequences to decode."""

    prefill_groups: list[list[Sequence]]
    decode: list[Sequence]

    @property
    def is_empty(self) -> bool:
        return not self.prefill_groups and not self.decode


class Scheduler:
    """Decides each step's batch. ``relocate(src_slot, dst_slot, num_tokens)`` moves cached keys/values."""

    def __init__(self, config: SchedulerConfig, relocate: Callable[[int, int, int], None]) -> None:
        self.config = config
        self.relocate = relocate
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # index == slot
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
        """Admit waiting sequences (prefill step) if any fit; otherwise decode every running sequence."""
        admitted = self._admit()
        if admitted:
            return Batch(self._group_for_prefill(admitted), [])
        self._make_room_to_grow()
        return Batch([], list(self.running))

    def _admit(self) -> list[Sequence]:
        cfg = self.config
        admitted: list[Sequence] = []
        # leave every running row room for one more token, so admission does not force a preemption
        budget_left = cfg.max_cache_tokens - self.tokens_held - len(self.running)
        prefill_tokens = 0
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            seq = self.waiting[0]
            need = seq.num_tokens + 1
            if need > budget_left or (admitted and prefill_tokens + seq.num_tokens > cfg.max_prefill_tokens):
                break
            self.waiting.popleft()
            seq.status, seq.slot = SequenceStatus.RUNNING, len(self.running)
            self.running.append(seq)
            admitted.append(seq)
            budget_left -= need
            prefill_tokens += seq.num_tokens
        if len(admitted) > 1:
            # slots are interchangeable: longest first puts similar lengths side by side, so the
            # prefill groups come out fewer and larger (12 -> 7 forwards for the benchmark's 16 prompts)
            admitted.sort(key=lambda s: s.num_tokens, reverse=True)
            base = len(self.running) - len(admitted)
            for offset, seq in enumerate(admitted):
                seq.slot = base + offset
                self.running[base + offset] = seq
        return admitted

    @staticmethod
    def _group_for_prefill(seqs: list[Sequence]) -> list[list[Sequence]]:
        """Contiguous runs (slots stay consecutive) whose padding waste stays under the slack."""
        groups: list[list[Sequence]] = [[seqs[0]]]
        for seq in seqs[1:]:
            group = groups[-1]
            lengths = [s.num_tokens for s in group] + [seq.num_tokens]
            if max(lengths) * len(lengths) <= (1 + PREFILL_PADDING_SLACK) * sum(lengths):
                group.append(seq)
            else:
                groups.append([seq])
        return groups

    def _make_room_to_grow(self) -> None:
        while len(self.running) > 1 and self.tokens_held > self.config.max_cache_tokens:
            self.preempt(self.running[-1])

    def preempt(self, seq: Sequence) -> None:
        """Free a running sequence's slot; it waits at the front and is recomputed from its tokens."""
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
        slot = seq.slot
        last = self.running.pop()
        if last is not seq:
            # keep slots compact: the last sequence takes over the freed slot, with its cache
            self.relocate(last.slot, slot, last.num_cached)
            last.slot = slot
            self.running[slot] = last
        seq.slot, seq.num_cached = -1, 0
