"""One request's life in the engine: its tokens, sampler state, cache blocks, and the text it has shown.

Text is decoded incrementally and only emitted once stable: a window of a few tokens before the
unread ones is decoded with them (so BPE merges and leading-space rules resolve), and text ending in
U+FFFD (a multi-byte character split across tokens) is held back until the next token completes it.
Stop strings are searched in the stable text; the tail that could still become a stop string is held
back too, so a stop string never reaches the stream.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Hashable
from dataclasses import dataclass, field

from generation.constraints.constraint import FORCED_BELOW, Constraint
from generation.sample.sampler import SamplerState, SamplingParams
from watermark.config import SpecError
from watermark.schemes import family_of

REPLACEMENT_CHAR = "\ufffd"  # what a decoder yields for an incomplete UTF-8 sequence
DECODE_CONTEXT_TOKENS = 5  # tokens decoded before the new ones so merges and spaces resolve (as vLLM/TGI)


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class WatermarkInfo:
    """What a watermarked output says about its watermark (never the secret)."""

    spec: str
    key_id: str | None
    fingerprint: str
    family: str | None = None  # the scheme family's name (watermark.schemes), said once here


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class RequestOutput:
    """A request's state after a step: all tokens and text so far, and what is new since the last one."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    text_delta: str
    finished: bool
    finish_reason: str | None  # 'stop' | 'length' | 'abort' | 'error' (the constraint failed) once finished
    usage: Usage
    logprobs: list[float] | None = None  # chosen tokens' logprobs (pre-watermark), when asked
    top_logprobs: list[list[tuple[int, float]]] | None = None
    watermark: WatermarkInfo | None = None
    # generated-token indices the constraint left fewer than two choices (no watermark signal); [] if unconstrained
    forced_positions: list[int] = field(default_factory=list)
    error: str | None = None  # why the request failed (finish_reason 'error'), e.g. the constraint hit a dead end
    cumulative_logprob: float | None = None  # beam search / best_of: the score the sequence was ranked by
    decoding_stats: dict | None = None  # advanced decoding extras, e.g. speculative acceptance counts


@dataclass(frozen=True, slots=True)
class OutputDetails:
    """What an output carries beside its ids and text, each optional: the streamed part (``text_delta``,
    None: the whole text), whether it is the last, logprobs, the constraint's forced positions, an error,
    and a decoding method's score and extras."""

    text_delta: str | None = None
    finished: bool = True
    logprobs: list[float] | None = None
    top_logprobs: list | None = None
    forced_positions: list[int] | tuple = ()
    error: str | None = None
    cumulative_logprob: float | None = None
    stats: dict | None = None


NO_DETAILS = OutputDetails()


def request_output(request_id: str, prompt_ids: list[int], token_ids: list[int], text: str, finish_reason: str | None,
                   watermark=None, details: OutputDetails = NO_DETAILS) -> RequestOutput:
    """The one place a RequestOutput is assembled (engine steps and every decoding method): lists copied,
    usage counted, the watermark described by its public fields only. ``details.text_delta`` defaults to the
    whole text (a finished output handed over at once)."""
    d = details
    return RequestOutput(
        request_id=request_id, prompt_token_ids=list(prompt_ids), token_ids=list(token_ids), text=text,
        text_delta=text if d.text_delta is None else d.text_delta, finished=d.finished, finish_reason=finish_reason,
        usage=Usage(len(prompt_ids), len(token_ids)),
        logprobs=list(d.logprobs) if d.logprobs is not None else None,
        top_logprobs=list(d.top_logprobs) if d.top_logprobs is not None else None,
        watermark=watermark_info(watermark) if watermark is not None else None,
        forced_positions=list(d.forced_positions), error=d.error, cumulative_logprob=d.cumulative_logprob,
        decoding_stats=d.stats)


def watermark_info(watermark) -> WatermarkInfo:
    """The public description of a request's watermark: spec string, key id, fingerprint. A stand-in whose spec
    is not hashable (the evaluation's spoofer) is formatted each time."""
    spec = watermark.spec
    text = _spec_text(spec) if isinstance(spec, Hashable) else spec.format()
    return WatermarkInfo(text, watermark.key_id, watermark.fingerprint, _family_name(spec))


def _family_name(spec) -> str | None:
    """The spec's family name; None for a stand-in no family owns (the evaluation's spoofer)."""
    try:
        return family_of(spec).name
    except (SpecError, AttributeError):
        return None


@functools.lru_cache(maxsize=256)
def _spec_text(spec) -> str:
    """``spec.format()``, once per spec (specs are frozen): every output of every step carries it, and an
    hf:synthid spec's 30 keys took ~25 us a row to format (0.4 ms a step at 16 rows)."""
    return spec.format()


class TextTracker:
    """Incremental detokenizer plus stop-string scan over one sequence's generated ids."""

    __slots__ = ("emitted", "max_stop_len", "prefix_offset", "read_offset", "stop", "text", "tokenizer")

    def __init__(self, tokenizer, stop: list[str] | None) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop or ())
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""  # stable text so far (truncated before a stop string once one is found)
        self.emitted = 0  # characters of self.text already handed out as deltas
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def update(self, ids: list[int], final: bool = False) -> bool:
        """Take the generated ids (one more than last time); True if a stop string ended the text."""
        prefix_text = self._decode(ids[self.prefix_offset:self.read_offset])
        full = self._decode(ids[self.prefix_offset:])
        if len(full) > len(prefix_text) and (final or not full.endswith(REPLACEMENT_CHAR)):
            start = len(self.text)
            self.text += full[len(prefix_text):]
            self.prefix_offset = max(self.read_offset, len(ids) - DECODE_CONTEXT_TOKENS)
            self.read_offset = len(ids)
            if self.stop and self._truncate_at_stop(start):
                return True
        return False

    def _truncate_at_stop(self, new_from: int) -> bool:
        search_from = max(0, new_from - self.max_stop_len + 1)
        hits = [i for i in (self.text.find(s, search_from) for s in self.stop) if i >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        return True

    def take_delta(self, final: bool) -> str:
        """Text not yet handed out; unless final, minus a tail that may still grow into a stop string."""
        end = len(self.text)
        if not final and self.stop:
            end -= self._stop_prefix_tail()
        end = max(end, self.emitted)
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta

    def _stop_prefix_tail(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of some stop string."""
        for length in range(min(self.max_stop_len - 1, len(self.text)), 0, -1):
            tail = self.text[-length:]
            if any(s.startswith(tail) for s in self.stop):
                return length
        return 0


@dataclass(eq=False)
class Sequence:
    """Engine-side record of one request (identity-compared: one object per request)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    sampler_state: SamplerState
    text: TextTracker
    watermark: object | None = None  # watermark.scheme.Watermark
    arrival: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)  # the paged cache's blocks holding its keys/values
    num_cached: int = 0  # tokens whose keys/values are in its blocks (all but the newest, between steps)
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of its full blocks (prefix caching)
    num_registered: int = 0  # leading blocks of block_table registered for prefix caching
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    num_preemptions: int = 0
    constraint: Constraint | None = None  # this sequence's place in its grammar; advanced once per token
    allowed_counts: list[int] = field(default_factory=list)  # per generated token: how many the constraint allowed
    forced_positions: list[int] = field(default_factory=list)  # indices with allowed count < FORCED_BELOW
    error: str | None = None

    def record_allowed(self, count: int) -> None:
        """Note how many tokens the constraint allowed for the token about to be appended."""
        if count < FORCED_BELOW:
            self.forced_positions.append(len(self.allowed_counts))
        self.allowed_counts.append(count)

    @property
    def cache_lookup(self) -> bool:
        """Whether the prompt may reuse cached blocks: not for a seeded request, whose tokens must not
        depend on what ran before it (a cached prefix matches a fresh one only up to float rounding)."""
        return self.params.seed is None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def all_ids(self) -> list[int]:
        """Prompt plus generated ids (shared with the sampler state; do not mutate)."""
        return self.sampler_state.history

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
