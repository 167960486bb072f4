"""Constrained decoding: regex, JSON-schema, choice and token-set constraints as per-row logit masks.

The grammar-to-token-mask work is llguidance's (chosen over xgrammar, which pulls in ~1 GB of triton,
and outlines-core, which compiles for ~1 s and cannot read a tokenizer object: docs/research/constraints-libraries.md):
a compiled grammar is kept as a template matcher per spec, and each sequence gets a copy that shares the
template's warm lexer. Each step every constrained row fills its bitmask row and one pass puts -inf
outside the allowed sets (generation/constraints/masks.py); rows without a constraint are never touched.
The mask comes before the watermark bias, so the watermark only reweights what the constraint allows.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import llguidance
import torch

from generation.constraints.masks import (
    ConstraintMasks,
    apply_constraints_,
    clear_tail_,
    compute_masks,
    count_bits,
    pack_ids,
    start_masks,
    unpack_bits,
    words_per_row,
)

__all__ = [
    "FORCED_BELOW",
    "Constraint",
    "ConstraintCompiler",
    "ConstraintError",
    "ConstraintMasks",
    "ConstraintSpec",
    "apply_constraints_",
    "compute_masks",
    "forced_positions",
    "start_masks",
]

GRAMMAR_CACHE_SIZE = 128  # distinct specs kept compiled; a template costs ~1 MB at most with its lexer cache
FORCED_BELOW = 2  # a position with fewer than two allowed tokens leaves the watermark no choice to bias
# compact-but-readable JSON: the model writes ", " / ": " as in most JSON it has seen; no free whitespace
# (a small model left to choose whitespace can loop on newlines forever)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(ValueError):
    """A constraint is malformed, or a token outside the allowed set was fed to it."""


def _regex_literal(text: str) -> str:
    """``text`` as a regex matching exactly itself: every non-alphanumeric character hex-escaped."""
    return "".join(ch if ch.isascii() and ch.isalnum() else f"\\x{{{ord(ch):X}}}" for ch in text)


@dataclass(slots=True)
class ConstraintSpec:
    """What a request's output must be: exactly one of a regex (full match), a JSON schema, one of
    ``choice`` strings, or a sequence drawn from ``allowed_token_ids``.

    Grammars are checked here (no tokenizer needed): a bad regex or schema raises ConstraintError
    naming the field."""

    regex: str | None = None
    json_schema: dict | str | None = None
    choice: list[str] | None = None
    allowed_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("regex", "json_schema", "choice", "allowed_token_ids") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ConstraintError(f"constraint: give exactly one of regex, json_schema, choice, allowed_token_ids; got {given or 'none'}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ConstraintError("regex: expected a non-empty string")
        if self.json_schema is not None:
            self.json_schema = self._schema_dict(self.json_schema)
        if self.choice is not None:
            if not isinstance(self.choice, (list, tuple)) or not self.choice:
                raise ConstraintError("choice: expected a non-empty list of strings")
            if not all(isinstance(c, str) and c for c in self.choice):
                raise ConstraintError("choice: every choice must be a non-empty string")
            self.choice = list(dict.fromkeys(self.choice))  # duplicates change nothing
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if not isinstance(ids, (list, tuple)) or not ids:
                raise ConstraintError("allowed_token_ids: expected a non-empty list of token ids")
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ConstraintError("allowed_token_ids: every id must be an integer >= 0")
            self.allowed_token_ids = sorted(set(ids))
        grammar = self.grammar()
        if grammar is not None:
            problem = llguidance.LLMatcher.validate_grammar(grammar)
            if problem:
                raise ConstraintError(f"{self.kind}: {problem.strip()}")

    @staticmethod
    def _schema_dict(schema) -> dict:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ConstraintError(f"json_schema: not valid JSON ({exc.msg} at position {exc.pos})") from None
            except RecursionError:  # deeper than the parser's stack: far past any schema llguidance compiles
                raise ConstraintError("json_schema: nested too deep") from None
        if isinstance(schema, bool):  # JSON Schema's true / false
            schema = {} if schema else {"not": {}}
        if not isinstance(schema, dict):
            raise ConstraintError(f"json_schema: expected an object, got {type(schema).__name__}")
        return schema

    @property
    def kind(self) -> str:
        return next(n for n in ("regex", "json_schema", "choice", "allowed_token_ids") if getattr(self, n) is not None)

    def grammar(self) -> str | None:
        """llguidance grammar text for this spec; None for a token set (no grammar)."""
        if self.regex is not None:
            return llguidance.LLMatcher.grammar_from_regex(self.regex)
        if self.json_schema is not None:
            return llguidance.LLMatcher.grammar_from_json_schema(self.json_schema, defaults=JSON_OPTIONS)
        if self.choice is not None:
            return llguidance.LLMatcher.grammar_from_regex("(?:" + "|".join(map(_regex_literal, self.choice)) + ")")
        return None

    def cache_key(self) -> tuple:
        if self.json_schema is not None:
            return ("json_schema", json.dumps(self.json_schema, sort_keys=True))
        if self.choice is not None:
            return ("choice", tuple(self.choice))
        if self.allowed_token_ids is not None:
            return ("allowed_token_ids", tuple(self.allowed_token_ids))
        return ("regex", self.regex)


class Constraint:
    """One sequence's position inside its constraint.

    Protocol per step: ``fill_mask`` (or ``apply_constraints_`` for a batch), sample, ``advance``.
    ``error`` is set (and only EOS is allowed) if the grammar reached a state where no token fits.
    """

    __slots__ = ("eos_token_ids", "error", "last_allowed", "vocab_size")

    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.last_allowed: int | None = None
        self.error: str | None = None

    def _fill(self, out_row: torch.Tensor) -> None:
        raise NotImplementedError

    def fill_mask(self, out_row: torch.Tensor) -> None:
        """Write the tokens allowed now into ``out_row``: an int32 bitmask row [ceil(V/32)] or a BoolTensor[V]."""
        words = torch.zeros(words_per_row(self.vocab_size), dtype=torch.int32) if out_row.dtype == torch.bool else out_row
        self._fill(words)
        clear_tail_(words, self.vocab_size)
        self.last_allowed = count_bits(words.reshape(1, -1))[0]
        if out_row.dtype == torch.bool:
            out_row.copy_(unpack_bits(words, self.vocab_size))

    def allowed_count(self) -> int:
        """Tokens allowed at the last mask (0 before the first one)."""
        return self.last_allowed or 0

    def advance(self, token_id: int) -> None:
        raise NotImplementedError

    def is_complete(self) -> bool:
        raise NotImplementedError

    def copy(self) -> Constraint:
        raise NotImplementedError


class GrammarConstraint(Constraint):
    """A regex / JSON-schema / choice constraint: an llguidance matcher of its own."""

    __slots__ = ("matcher",)

    def __init__(self, matcher, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self.matcher = matcher

    def _fill(self, out_row: torch.Tensor) -> None:
        if not (out_row.dtype == torch.int32 and out_row.is_contiguous() and out_row.device.type == "cpu"):
            raise ValueError("out_row: expected a contiguous CPU int32 bitmask row")
        self.matcher.unsafe_compute_mask_ptr(out_row.data_ptr(), out_row.numel() * out_row.element_size())
        if self.matcher.is_error():
            self.error = self.matcher.get_error()

    def advance(self, token_id: int) -> None:
        """Accept the sampled token; ConstraintError if the grammar does not allow it."""
        if self.error is not None and token_id in self.eos_token_ids:
            return  # the failed row is being ended with EOS
        if not self.matcher.consume_token(int(token_id)):
            raise ConstraintError(f"token {int(token_id)} is not allowed here: {self.matcher.get_error()}")

    def is_complete(self) -> bool:
        """The output so far is a full match and nothing but EOS may follow."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def copy(self) -> GrammarConstraint:
        twin = GrammarConstraint(self.matcher.deep_copy(), self.vocab_size, self.eos_token_ids)
        twin.last_allowed, twin.error = self.last_allowed, self.error
        return twin


class TokenSetConstraint(Constraint):
    """Every token must come from a fixed set (EOS only if the set holds it); never complete by itself."""

    __slots__ = ("allowed", "words")

    def __init__(self, words: torch.Tensor, allowed: frozenset[int], vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self.words, self.allowed = words, allowed

    def _fill(self, out_row: torch.Tensor) -> None:
        out_row.copy_(self.words)

    def advance(self, token_id: int) -> None:
        if int(token_id) not in self.allowed:
            raise ConstraintError(f"token {int(token_id)} is not in allowed_token_ids")

    def is_complete(self) -> bool:
        return False

    def copy(self) -> TokenSetConstraint:
        twin = TokenSetConstraint(self.words, self.allowed, self.vocab_size, self.eos_token_ids)
        twin.last_allowed = self.last_allowed
        return twin


class ConstraintCompiler:
    """Turns ConstraintSpecs into per-sequence Constraints for one tokenizer and logits width V.

    Thread-safe. The tokenizer is converted on first use (~0.3-0.5 s), so engines that never see a
    constraint pay nothing; compiled grammars are cached (LRU) and shared by copy."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids: Iterable[int] | None = None,
                 cache_size: int = GRAMMAR_CACHE_SIZE) -> None:
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        if len(tokenizer) > vocab_size:
            raise ValueError(f"vocab_size: the tokenizer has {len(tokenizer)} tokens, more than the model's {vocab_size} logits")
        eos = sorted(set(eos_token_ids)) if eos_token_ids is not None else [tokenizer.eos_token_id]
        if not eos or any(e is None or not 0 <= e < vocab_size for e in eos):
            raise ValueError(f"eos_token_ids: expected ids in [0, {vocab_size}), got {eos}")
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos)
        self.cache_size = cache_size
        self._ll_tokenizer = None
        self._templates: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()

    def _llg_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance.hf  # noqa: PLC0415 (it imports transformers, heavy: loaded with a constraint)

            # n_vocab = the model's V: ids past the tokenizer's end are never allowed
            self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size, eos_token=list(self.eos_token_ids))
        return self._ll_tokenizer

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """A fresh Constraint at the start of ``spec``; ConstraintError if it cannot be built for this vocabulary."""
        if not isinstance(spec, ConstraintSpec):
            raise TypeError(f"spec must be a ConstraintSpec, got {type(spec).__name__}")
        if spec.allowed_token_ids is not None:
            bad = [i for i in spec.allowed_token_ids if i >= self.vocab_size]
            if bad:
                raise ConstraintError(f"allowed_token_ids: ids {bad[:5]} outside [0, {self.vocab_size})")
            ids = spec.allowed_token_ids
            return TokenSetConstraint(pack_ids(ids, self.vocab_size), frozenset(ids), self.vocab_size, self.eos_token_ids)
        key = spec.cache_key()
        with self._lock:
            template = self._templates.get(key)
            if template is None:
                template = self._build(spec)
                self._templates[key] = template
                while len(self._templates) > self.cache_size:
                    self._templates.popitem(last=False)
            else:
                self._templates.move_to_end(key)
            matcher = template.deep_copy()  # shares the template's compiled lexer: later masks are cheap
        return GrammarConstraint(matcher, self.vocab_size, self.eos_token_ids)

    def _build(self, spec: ConstraintSpec):
        matcher = llguidance.LLMatcher(self._llg_tokenizer(), spec.grammar(), log_level=0)
        if matcher.is_error():
            raise ConstraintError(f"{spec.kind}: {matcher.get_error().strip()}")
        return matcher


def forced_positions(allowed_counts: Sequence[int | None]) -> list[int]:
    """Indices of generated positions whose constraint allowed fewer than two tokens.

    Such a token was chosen by the grammar, not by the sampler, so it carries no watermark: a
    detector that knows them leaves them out of the scored positions."""
    return [i for i, n in enumerate(allowed_counts) if n is not None and n < FORCED_BELOW]
