"""SamplingParams (what one request asks of the sampler, validated at the door) and SamplerState
(what the sampler remembers about one sequence between steps)."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from generation.constraints.constraint import ConstraintSpec
from watermark.field_error import FieldError

# Temperatures below this decode greedily (argmax), as vLLM does (its _SAMPLING_EPS). Dividing logits by
# a temperature near the smallest float overflows fp32 (30 / 1e-38 > 3.4e38), and every overflowed token
# then shares the row's mass: seed-dependent garbage where the request asked for the most likely token.
# At 1e-5 a draw differs from argmax only when the top two logits are within ~1e-4 of each other.
GREEDY_TEMPERATURE = 1e-5
MIROSTAT_MODES = (0, 1, 2)  # off, v1, v2 (Basu et al. 2021, "Mirostat", algorithms 1 and 2)


def _fail(field: str, value: object, rule: str) -> None:
    raise FieldError(field, f"{value!r}: {rule}", f"SamplingParams.{field}={value!r}: {rule}")


def _check_token_ids(field: str, ids, vocab_size: int) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        _fail(field, bad[:5], f"token ids must lie in [0, {vocab_size})")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling settings. Defaults leave the model's distribution unchanged."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0  # 0 (or anything below GREEDY_TEMPERATURE) => greedy, as in the OpenAI / vLLM APIs
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    mirostat_mode: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    repetition_penalty: float = 1.0  # CTRL-style (Keskar et al. 2019), as transformers
    presence_penalty: float = 0.0  # OpenAI-style, over generated tokens only
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    no_repeat_ngram_size: int = 0
    bad_words_ids: list[list[int]] | None = None
    stop: list[str] | None = None  # stop strings, checked by the engine on decoded text
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # None = off; k >= 0 => chosen token logprob + top-k logprobs
    # what the output must be (regex / JSON schema / choice / token set); a field here, not a submit()
    # argument, so the CLI and HTTP layers build one object from flat fields and generate() mixes
    # constrained and free rows through its per-prompt params
    constraint: ConstraintSpec | None = None

    def __post_init__(self) -> None:
        self._check_ints()
        self._check_floats()
        self._check_collections()

    def _check_ints(self) -> None:
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "no_repeat_ngram_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                _fail(name, value, "must be an int")
        if self.max_new_tokens < 1:
            _fail("max_new_tokens", self.max_new_tokens, "must be >= 1")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            _fail("min_new_tokens", self.min_new_tokens, "must be in [0, max_new_tokens]")
        if self.top_k < 0:
            _fail("top_k", self.top_k, "must be >= 0 (0 = off)")
        if self.no_repeat_ngram_size < 0:
            _fail("no_repeat_ngram_size", self.no_repeat_ngram_size, "must be >= 0 (0 = off)")
        if self.mirostat_mode not in MIROSTAT_MODES or isinstance(self.mirostat_mode, bool):
            _fail("mirostat_mode", self.mirostat_mode, "must be 0 (off), 1 or 2")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            _fail("seed", self.seed, "must be an int or None")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            _fail("seed", self.seed, "must be in [0, 2**64)")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or self.logprobs < 0):
            _fail("logprobs", self.logprobs, "must be None or an int >= 0")

    def _check_floats(self) -> None:
        ranges = {  # name: (low, low inclusive, high, high inclusive)
            "temperature": (0.0, True, math.inf, False),
            "top_p": (0.0, False, 1.0, True),
            "min_p": (0.0, True, 1.0, True),
            "typical_p": (0.0, False, 1.0, True),
            "epsilon_cutoff": (0.0, True, 1.0, False),
            "eta_cutoff": (0.0, True, 1.0, False),
            "mirostat_tau": (0.0, False, math.inf, False),
            "mirostat_eta": (0.0, False, 1.0, True),
            "repetition_penalty": (0.0, False, math.inf, False),
            "presence_penalty": (-2.0, True, 2.0, True),  # OpenAI's documented range
            "frequency_penalty": (-2.0, True, 2.0, True),
        }
        for name, (low, low_in, high, high_in) in ranges.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                _fail(name, value, "must be a finite number")
            above = value >= low if low_in else value > low
            below = value <= high if high_in else value < high
            if not (above and below):
                _fail(name, value, f"must be in {'[' if low_in else '('}{low}, {high}{']' if high_in else ')'}")

    def _check_collections(self) -> None:
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                _fail("logit_bias", "<not a dict>", "must be a dict {token_id: bias}")
            for token, bias in self.logit_bias.items():
                if isinstance(token, bool) or not isinstance(token, int):
                    _fail("logit_bias", token, "keys must be int token ids")
                if isinstance(bias, bool) or not isinstance(bias, (int, float)) or math.isnan(bias):
                    _fail("logit_bias", bias, "values must be numbers")
        if self.bad_words_ids is not None:
            if not isinstance(self.bad_words_ids, list) or not all(
                isinstance(w, list) and w and all(isinstance(t, int) and not isinstance(t, bool) for t in w)
                for w in self.bad_words_ids
            ):
                _fail("bad_words_ids", "<malformed>", "must be a list of non-empty lists of int token ids")
        if self.stop is not None:
            if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
                _fail("stop", "<malformed>", "must be a list of non-empty strings")
        if self.stop_token_ids is not None:
            if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids
            ):
                _fail("stop_token_ids", "<malformed>", "must be a list of int token ids")
        if self.constraint is not None:
            if not isinstance(self.constraint, ConstraintSpec):
                _fail("constraint", type(self.constraint).__name__, "must be a generation.constraints.constraint.ConstraintSpec or None")
            if self.logit_bias and any(math.isinf(b) and b > 0 for b in self.logit_bias.values()):
                # +inf on a token the constraint masked to -inf would make NaN
                _fail("logit_bias", "+inf", "must not be +inf when a constraint is given")

    @property
    def greedy(self) -> bool:
        """True when the request decodes by argmax (temperature 0, or below GREEDY_TEMPERATURE, where a
        draw is argmax up to float rounding); such rows draw no randomness, in every decoding path."""
        return self.temperature < GREEDY_TEMPERATURE

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Raise ValueError naming the field if any token id lies outside [0, vocab_size)."""
        if self.logit_bias:
            _check_token_ids("logit_bias", list(self.logit_bias), vocab_size)
        if self.bad_words_ids:
            _check_token_ids("bad_words_ids", [t for w in self.bad_words_ids for t in w], vocab_size)
        if self.stop_token_ids:
            _check_token_ids("stop_token_ids", self.stop_token_ids, vocab_size)
        if self.constraint is not None and self.constraint.allowed_token_ids is not None:
            _check_token_ids("constraint.allowed_token_ids", self.constraint.allowed_token_ids, vocab_size)


class SamplerState:
    """One sequence's sampling state: its generator, history, penalty counts and mirostat mu.

    The engine creates one per sequence and calls append() after each accepted token.
    """

    __slots__ = (
        "params", "eos_token_ids", "generator", "history", "prompt_len", "counts", "mirostat_mu",
        "pending_surprise", "_seen", "_seen_ids", "_count_tensors", "_ngrams", "_bad_single",
        "_bad_multi", "_bias", "_min_new_bans", "watermark_memory", "kind_count",
    )

    def __init__(self, params: SamplingParams, prompt_ids: list[int], eos_token_ids: set[int]):
        self.params = params
        self.eos_token_ids = frozenset(eos_token_ids)
        self.generator = torch.Generator(device="cpu")
        # no seed: fresh OS randomness, so unseeded requests never share a stream
        self.generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        self.history: list[int] = [int(t) for t in prompt_ids]
        self.prompt_len = len(self.history)
        self.kind_count = (self.prompt_len, 0)  # (history counted up to, codeish generated tokens): LogitsPipeline
        self.counts: dict[int, int] = {}  # generated tokens only (OpenAI penalties)
        self.mirostat_mu = 2.0 * params.mirostat_tau  # the paper's initial "maximum surprise"
        self.pending_surprise: tuple[int, float] | None = None  # (token, surprise in bits) from sample()
        self._seen = set(self.history)
        self._seen_ids: torch.Tensor | None = None
        self._count_tensors: tuple[torch.Tensor, torch.Tensor] | None = None
        n = params.no_repeat_ngram_size
        self._ngrams: dict[tuple[int, ...], set[int]] | None = {} if n else None
        if n:
            for end in range(n, len(self.history) + 1):
                self._ngrams.setdefault(tuple(self.history[end - n:end - 1]), set()).add(self.history[end - 1])
        words = params.bad_words_ids or []
        self._bad_single = [w[0] for w in words if len(w) == 1]
        self._bad_multi = [(w[:-1], w[-1]) for w in words if len(w) > 1]
        bias = params.logit_bias or {}
        self._bias = (torch.tensor(list(bias), dtype=torch.long), torch.tensor(list(bias.values()), dtype=torch.float32)) if bias else None
        self._min_new_bans = sorted(self.eos_token_ids | set(params.stop_token_ids or ()))
        # a sampling watermark's per-sequence memory (generation.sample.context_memory), made on first use
        self.watermark_memory = None

    @property
    def generated(self) -> list[int]:
        return self.history[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        return len(self.history) - self.prompt_len

    def append(self, token_id: int) -> None:
        """Record an accepted token; applies the mirostat mu update if sample() chose this token."""
        token_id = int(token_id)
        self.history.append(token_id)
        self.counts[token_id] = self.counts.get(token_id, 0) + 1
        self._count_tensors = None
        if token_id not in self._seen:
            self._seen.add(token_id)
            self._seen_ids = None
        n = self.params.no_repeat_ngram_size
        if n and len(self.history) >= n:
            self._ngrams.setdefault(tuple(self.history[-n:-1]), set()).add(token_id)
        if self.pending_surprise is not None and self.pending_surprise[0] == token_id:
            surprise = self.pending_surprise[1]
            # Basu et al. 2021, alg. 1/2: mu <- mu - eta * (observed surprise - tau)
            self.mirostat_mu -= self.params.mirostat_eta * (surprise - self.params.mirostat_tau)
        self.pending_surprise = None

    def seen_ids(self) -> torch.Tensor:
        """Distinct token ids of prompt and generated text (repetition penalty domain, as transformers)."""
        if self._seen_ids is None:
            self._seen_ids = torch.tensor(sorted(self._seen), dtype=torch.long)
        return self._seen_ids

    def count_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(distinct generated ids, their counts) for presence / frequency penalties."""
        if self._count_tensors is None:
            self._count_tensors = (
                torch.tensor(list(self.counts), dtype=torch.long),
                torch.tensor(list(self.counts.values()), dtype=torch.float32),
            )
        return self._count_tensors

    def logit_bias_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._bias

    def banned_ids(self) -> list[int]:
        """Tokens that must not come next: no-repeat n-grams, bad words, EOS/stop before min_new_tokens."""
        banned = list(self._bad_single)
        h = self.history
        for prefix, last in self._bad_multi:
            if len(prefix) <= len(h) and h[len(h) - len(prefix):] == prefix:
                banned.append(last)
        n = self.params.no_repeat_ngram_size
        if n and len(h) >= n:
            banned.extend(self._ngrams.get(tuple(h[len(h) - n + 1:]), ()))
        if self.num_generated < self.params.min_new_tokens:
            banned.extend(self._min_new_bans)
        return banned
