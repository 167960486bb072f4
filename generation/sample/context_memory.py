"""What a sampling watermark remembers about one sequence: which contexts it has generated under.

Both memories are functions of the sequence's token history alone (never of what was sampled how),
so a speculative round can ask about drafted positions without disturbing the committed state, and a
preempted sequence recomputed from its tokens gets the same answers.

* ``GeneratedContexts`` (``gumbel:`` / ``synthid:`` with ``dedup=true``): a position is left to the
  ordinary draw when its context (last h tokens) was the context of an earlier generated position of
  the same sequence, so a repeated context is not resampled identically (SynthID-Text, G.3; vLLM's
  context dedup). Prompt positions do not count: the detector never sees the prompt.
* a family's own context rule (``SchemeFamily.context_memory``), e.g. ``watermark.hf_synthid.HFContextWindow``
  (``hf:synthid``): transformers' ``SynthIDTextWatermarkLogitsProcessor`` state.
  Its context is the last ngram_len - 1 GENERATED tokens, left-padded with zeros (the prompt is not
  used), and a step whose context hash is among the last ``context_history_size`` context hashes
  (a window that starts full of zeros) is left unwatermarked.
"""

from __future__ import annotations

from collections.abc import Sequence


class GeneratedContexts:
    """The contexts of a sequence's generated positions so far (absorbed lazily from its history)."""

    __slots__ = ("width", "start", "absorbed", "seen")

    def __init__(self, width: int, prompt_len: int) -> None:
        self.width = width
        self.start = prompt_len
        self.absorbed = prompt_len  # positions [start, absorbed) are in ``seen``
        self.seen: set[tuple[int, ...]] = set()

    def _context_at(self, history: Sequence[int], position: int) -> tuple[int, ...] | None:
        return tuple(history[position - self.width:position]) if position >= self.width else None

    def repeated(self, committed: Sequence[int], history: Sequence[int]) -> bool:
        """Whether the context ending ``history`` (``committed`` plus any drafted tokens) was the context
        of an earlier generated position. Committed positions are remembered; drafted ones are not."""
        for position in range(self.absorbed, len(committed)):
            context = self._context_at(committed, position)
            if context is not None:
                self.seen.add(context)
        self.absorbed = max(self.absorbed, len(committed))
        current = self._context_at(history, len(history))
        if current is None:
            return False
        if current in self.seen:
            return True
        return any(self._context_at(history, p) == current
                   for p in range(max(len(committed), self.start), len(history)))
