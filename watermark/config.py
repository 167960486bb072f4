"""WatermarkSpec: what a watermark is, as a value and as a spec string.

Two families share one type:

* ``kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0[,code_delta=3.5],prf=hmac-sha256[,hard]`` — our keyed
  red/green-list watermark (Kirchenbauer et al. 2023). The defaults follow the authors'
  recommendation in "On the Reliability of Watermarks for LLMs" (selfhash, h = 4, gamma = 0.25,
  delta = 2.0). ``code_delta`` is the bias while the sequence being generated reads as code
  (``watermark.text_kind``); left out, code gets ``delta`` too. The default spec sets it
  (``DEFAULT_CODE_DELTA``, docs/schemes.md): code from a small model has so little entropy that
  delta = 2 leaves a quarter of 200-token answers undetected. Detection never reads either bias.
* ``hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0,hashing_key=15485863,context_width=1``
  — transformers' ``WatermarkingConfig``, with transformers' own parameter names, so text
  watermarked by ``model.generate(watermarking_config=...)`` can be detected here.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field, replace

SCHEMES = ("lefthash", "minhash", "selfhash", "unigram")
HF_SCHEMES = ("lefthash", "selfhash")
PRFS = ("hmac-sha256", "sha3-256")
KGW_KIND = "kgw"  # the two families of this spec type (watermark.schemes.kgw, watermark.schemes.hf)
HF_KIND = "hf"
HF_SYNTHID_TAG = "synthid"  # hf:synthid,... is its own family (watermark.schemes.hf_synthid)
MAX_CONTEXT_WIDTH = 64  # far beyond any published setting; bounds per-position work
HF_DEFAULT_HASHING_KEY = 15485863  # transformers' default: the millionth prime
# Numeric bounds, one table for every place a spec is accepted (engine, CLI, both services, vLLM plugin):
# they are checked here, when a spec is built, so nothing downstream sees a value outside them.
#   h / context_width  1..64 (unigram: 0)   far beyond any published setting; bounds per-position work
#   gamma              (0, 1) exclusive     a green fraction
#   delta              [0, 100]             on fp32 logits a bias past ~88 (e^-88 is the smallest normal
#                                           float) already zeroes every red token whose logit is not far
#                                           above the best green one: a hard list in all but name (use
#                                           ``hard`` for that); above it exp(delta) overflows float math
#   hashing_key (hf)   0..2**63-1           transformers multiplies it with int64 token ids, as we do
MAX_DELTA = 100.0
DEFAULT_CODE_DELTA = 3.5  # the default spec's bias on code (docs/schemes.md, "Code")
MAX_SPEC_CHARS = 256  # the longest spec written out in full is under 120 characters
MAX_HASHING_KEY = 2**63 - 1


class SpecError(ValueError):
    """A spec string or field is invalid; the message names the field."""


def kept_text(method):
    """A spec value's ``format``, computed on the first call and kept on the (frozen) value."""

    @functools.wraps(method)
    def format(self) -> str:
        text = self._text
        if text is None:
            text = method(self)
            object.__setattr__(self, "_text", text)
        return text

    return format


def kept_fingerprint(method):
    """A spec value's ``fingerprint(V)``, computed once per V and kept on the (frozen) value."""

    @functools.wraps(method)
    def fingerprint(self, vocab_size: int) -> str:
        found = self._fingerprints.get(vocab_size) if isinstance(vocab_size, int) else None
        if found is None:
            found = method(self, vocab_size)
            self._fingerprints[vocab_size] = found
        return found

    return fingerprint


@dataclass(frozen=True, slots=True)
class WatermarkSpec:
    kind: str = KGW_KIND
    scheme: str = "selfhash"
    context_width: int = 4
    gamma: float = 0.25
    delta: float = 2.0
    code_delta: float | None = None  # kgw: the bias while the output reads as code; None = delta
    hard: bool = False
    prf: str = "hmac-sha256"
    hashing_key: int = HF_DEFAULT_HASHING_KEY  # hf only: transformers' public integer key
    _text: str | None = field(default=None, init=False, repr=False, compare=False)  # format(), kept
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # fingerprint(V), kept

    def __post_init__(self) -> None:
        if self.kind not in (KGW_KIND, HF_KIND):
            raise SpecError(f"kind: expected 'kgw' or 'hf', got {self.kind!r}")
        allowed = SCHEMES if self.kind == KGW_KIND else HF_SCHEMES
        if self.scheme not in allowed:
            raise SpecError(f"scheme: expected one of {', '.join(allowed)}, got {self.scheme!r}")
        if isinstance(self.context_width, bool) or not isinstance(self.context_width, int):
            raise SpecError(f"context_width (h): expected an integer, got {self.context_width!r}")
        if self.scheme == "unigram":
            if self.context_width != 0:
                raise SpecError(f"h: the unigram scheme uses no context (h=0), got h={self.context_width}")
        elif not 1 <= self.context_width <= MAX_CONTEXT_WIDTH:
            raise SpecError(f"h: expected 1..{MAX_CONTEXT_WIDTH}, got {self.context_width}")
        if not (isinstance(self.gamma, (int, float)) and 0.0 < self.gamma < 1.0):
            raise SpecError(f"gamma: expected a fraction strictly between 0 and 1, got {self.gamma!r}")
        if not (isinstance(self.delta, (int, float)) and math.isfinite(self.delta) and 0 <= self.delta <= MAX_DELTA):
            raise SpecError(f"delta: expected a number in [0, {MAX_DELTA:g}] (use 'hard' for a hard green list), "
                            f"got {self.delta!r}")
        if self.code_delta is not None:
            if self.kind != KGW_KIND:
                raise SpecError("code_delta: only kgw specs take it (transformers' watermark has one bias)")
            if not (isinstance(self.code_delta, (int, float)) and not isinstance(self.code_delta, bool)
                    and math.isfinite(self.code_delta) and 0 <= self.code_delta <= MAX_DELTA):
                raise SpecError(f"code_delta: expected a number in [0, {MAX_DELTA:g}], got {self.code_delta!r}")
            object.__setattr__(self, "code_delta", float(self.code_delta))
        if self.kind == KGW_KIND and self.prf not in PRFS:
            raise SpecError(f"prf: expected one of {', '.join(PRFS)}, got {self.prf!r}")
        if self.kind == HF_KIND and self.hard:
            raise SpecError("hard: transformers' watermark has no hard mode")
        if self.kind == HF_KIND and (isinstance(self.hashing_key, bool) or not isinstance(self.hashing_key, int)
                                  or not 0 <= self.hashing_key <= MAX_HASHING_KEY):
            raise SpecError(f"hashing_key: expected an integer in 0..2**63-1, got {self.hashing_key!r}")
        object.__setattr__(self, "gamma", float(self.gamma))
        object.__setattr__(self, "delta", float(self.delta))

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def default(cls) -> "WatermarkSpec":
        """The spec new keys get: the dataclass defaults plus ``DEFAULT_CODE_DELTA`` (a spec string that leaves
        ``code_delta`` out has none, so the specs keys were bound to before it existed read as they did)."""
        return cls(code_delta=DEFAULT_CODE_DELTA)

    @classmethod
    def parse(cls, text: "str | WatermarkSpec") -> "WatermarkSpec":
        """Parse a ``kgw:`` or ``hf:`` spec string; fields left out take their defaults (any family's spec:
        ``watermark.specs.parse_spec``)."""
        if isinstance(text, cls):
            return text
        kind, fields = split_spec(text, MAX_SPEC_CHARS, "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",
                                  "the 'kgw:' or 'hf:' prefix")
        if kind == HF_KIND and HF_SYNTHID_TAG in fields:
            raise SpecError("spec: hf:synthid specs (sampling watermarks) are not green-list specs; use a kgw: or hf: "
                            "spec here (watermark.specs.parse_spec takes every family)")
        if kind == KGW_KIND:
            return cls._from_kgw_fields(fields)
        if kind == HF_KIND:
            return cls._from_hf_fields(fields)
        raise SpecError(f"kind: expected 'kgw' or 'hf', got {kind!r} (the sampling watermarks and the other "
                        "families: watermark.specs.parse_spec)")

    @classmethod
    def _from_kgw_fields(cls, fields: dict[str, str | None]) -> "WatermarkSpec":
        values: dict = {}
        for name, raw in fields.items():
            if name == "hard":
                values["hard"] = True if raw is None else _parse_bool("hard", raw)
            elif raw is None:
                raise SpecError(f"{name}: expected {name}=VALUE")
            elif name == "scheme":
                values["scheme"] = raw.lower()
            elif name in ("h", "context_width"):
                values["context_width"] = _parse_int(name, raw)
            elif name == "gamma":
                values["gamma"] = _parse_float(name, raw)
            elif name == "delta":
                values["delta"] = _parse_float(name, raw)
            elif name == "code_delta":
                values["code_delta"] = _parse_float(name, raw)
            elif name == "prf":
                values["prf"] = raw.lower()
            else:
                raise SpecError(f"{name}: unknown field for kgw (known: scheme, h, gamma, delta, code_delta, prf, hard)")
        if values.get("scheme") == "unigram":
            values.setdefault("context_width", 0)
        return cls(kind=KGW_KIND, **values)

    @classmethod
    def _from_hf_fields(cls, fields: dict[str, str | None]) -> "WatermarkSpec":
        names = {"seeding_scheme": "scheme", "greenlist_ratio": "gamma", "bias": "delta",
                 "hashing_key": "hashing_key", "context_width": "context_width"}
        values: dict = {"scheme": "lefthash", "context_width": 1}
        for name, raw in fields.items():
            if name not in names:
                raise SpecError(f"{name}: unknown field for hf (known: {', '.join(names)})")
            if raw is None:
                raise SpecError(f"{name}: expected {name}=VALUE")
            target = names[name]
            if target == "scheme":
                values[target] = raw.lower()
            elif target in ("hashing_key", "context_width"):
                values[target] = _parse_int(name, raw)
            else:
                values[target] = _parse_float(name, raw)
        return cls(kind=HF_KIND, **values)

    # ---- presentation ---------------------------------------------------------------------
    @kept_text
    def format(self) -> str:
        """The canonical spec string: every field, fixed order; ``parse(format())`` is identity."""
        if self.kind == HF_KIND:
            return (f"hf:seeding_scheme={self.scheme},greenlist_ratio={self.gamma!r},bias={self.delta!r},"
                    f"hashing_key={self.hashing_key},context_width={self.context_width}")
        text = (f"kgw:scheme={self.scheme},h={self.context_width},gamma={self.gamma!r},"
                f"delta={self.delta!r}" + (f",code_delta={self.code_delta!r}" if self.code_delta is not None else "")
                + f",prf={self.prf}")
        return text + (",hard" if self.hard else "")

    def __str__(self) -> str:
        return self.format()

    @kept_fingerprint
    def fingerprint(self, vocab_size: int) -> str:
        """A stable 128-bit hex digest of the canonical spec (without ``code_delta``) and the vocabulary size V."""
        if not isinstance(vocab_size, int) or vocab_size <= 0:
            raise SpecError(f"vocab_size: expected a positive integer, got {vocab_size!r}")
        # code_delta is left out: it only says how hard code is pushed, so a spec with it and one without share their
        # fingerprint, and the calibrations stored under it (keys bound before code_delta existed keep theirs)
        canonical = replace(self, code_delta=None).format()
        digest = hashlib.sha256(f"provmark-spec/v1|{canonical}|V={vocab_size}".encode()).hexdigest()
        return digest[:32]

    def delta_for(self, code: bool) -> float:
        """The soft bias for a row whose output reads as code (``code``) or not."""
        return self.code_delta if code and self.code_delta is not None else self.delta

    @property
    def needs_key(self) -> bool:
        """kgw specs are keyed by a keyring secret; hf specs carry their own public integer key."""
        return self.kind == KGW_KIND

    def with_(self, **changes) -> "WatermarkSpec":
        return replace(self, **changes)


def split_spec(text, max_chars: int, example: str, prefix: str) -> tuple[str, dict[str, str | None]]:
    """A spec string's kind (lower case) and its fields, or a SpecError naming what is wrong (every spec
    family's parser starts here)."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"spec: expected a string like {example!r}")
    if len(text) > max_chars:
        raise SpecError(f"spec: longer than {max_chars} characters")
    kind, sep, body = text.strip().partition(":")
    if not sep:
        raise SpecError(f"spec: missing {prefix} in {text!r}")
    return kind.strip().lower(), _split_fields(body)


def _split_fields(body: str) -> dict[str, str | None]:
    fields: dict[str, str | None] = {}
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, raw = part.partition("=")
        name = name.strip().lower()
        if name in fields:
            raise SpecError(f"{name}: given twice")
        fields[name] = raw.strip() if eq else None
    return fields


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise SpecError(f"{name}: expected an integer, got {raw!r}") from None


def _parse_float(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SpecError(f"{name}: expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise SpecError(f"{name}: expected a finite number, got {raw!r}")
    return value


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise SpecError(f"{name}: expected true or false, got {raw!r}")
