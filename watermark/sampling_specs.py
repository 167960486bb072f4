"""Specs of the sampling watermarks (the sampler itself is keyed), as values and as spec strings.

Four families (each one module of the registry, ``watermark.schemes``; each class parses and prints its own
spec strings), beside ``kgw:`` and ``hf:`` (``watermark.config.WatermarkSpec``)::

    gumbel:h=4,prf=hmac-sha256,dedup=true                 Gumbel-max (Aaronson), keyed by our PRF
    synthid:h=4,layers=30,top_k=40,prf=hmac-sha256,dedup=true   tournament sampling (Dathathri et al. 2024)
    hf:synthid,keys=654:400:836,ngram_len=5,...           transformers' SynthIDTextWatermarkLogitsProcessor
    vllm:gumbel,context_width=4,dedup=true                vLLM's built-in Gumbel watermark (Philox PRF)

``h`` counts the prior tokens a position's random values depend on. ``dedup`` (generation) samples a
position whose context already occurred in the same sequence without the watermark, so a repeated
context is not resampled identically; detection always counts each (context, token) unit once.
``hf:synthid`` carries transformers' public integer keys in the spec, as ``hf:`` does. ``vllm:gumbel``
is keyed by a keyring key: its vLLM integer key is ``vllm_key_from_secret(secret)``, never written
into the spec.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from watermark.config import (
    PRFS,
    SpecError,
    _parse_bool,
    _parse_float,
    _parse_int,
    kept_fingerprint,
    kept_text,
    split_spec,
)

MAX_SAMPLING_CONTEXT = 64  # as for kgw: bounds per-position work
MAX_LAYERS = 64  # our synthid takes one bit per layer from one 64-bit keyed word
MAX_HF_LAYERS = 128
MAX_SYNTHID_TOP_K = 1 << 20  # above any vocabulary; 0 means the whole vocabulary
MAX_HF_SPEC_CHARS = 4096  # 30 keys of up to 20 digits fit with room to spare
HF_SYNTHID_TABLE_MAX = 2**24  # transformers' own bound (SynthIDTextWatermarkingConfig.validate)
VLLM_MAX_CONTEXT = 16  # vLLM warns above 16 and its HMAC PRF refuses more


class _SpecValue:
    """What every sampling spec value answers, as ``WatermarkSpec`` does."""

    __slots__ = ()

    @kept_fingerprint
    def fingerprint(self, vocab_size: int) -> str:
        return sampling_fingerprint(self, vocab_size)


@dataclass(frozen=True, slots=True)
class GumbelSpec(_SpecValue):
    """Our keyed Gumbel-max sampler: token = argmax_v log(r_v) / p_v, r_v = PRF(key, h prior tokens, v)."""

    context_width: int = 4
    prf: str = "hmac-sha256"
    dedup: bool = True
    kind: str = field(default="gumbel", init=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_width(self.context_width, MAX_SAMPLING_CONTEXT)
        _check_prf(self.prf)

    @classmethod
    def parse(cls, text: str) -> GumbelSpec:
        """``gumbel:h=4,prf=hmac-sha256,dedup=true``; fields left out take their defaults."""
        fields = _fields_of(text, "gumbel")
        return cls(**_fields(fields, {"h": ("context_width", int), "context_width": ("context_width", int),
                                      "prf": ("prf", str), "dedup": ("dedup", bool)}, "gumbel"))

    @kept_text
    def format(self) -> str:
        return f"gumbel:h={self.context_width},prf={self.prf},dedup={str(self.dedup).lower()}"

    needs_key = True


@dataclass(frozen=True, slots=True)
class SynthIDSpec(_SpecValue):
    """Our keyed tournament sampler: ``layers`` keyed binary g-functions of (h prior tokens, token)."""

    context_width: int = 4
    layers: int = 30
    prf: str = "hmac-sha256"
    dedup: bool = True
    top_k: int = 40  # the tournament runs over the k most likely tokens (0: all), as synthid-text does
    kind: str = field(default="synthid", init=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_width(self.context_width, MAX_SAMPLING_CONTEXT)
        _check_prf(self.prf)
        _check_int_range("layers", self.layers, 1, MAX_LAYERS)
        _check_int_range("top_k", self.top_k, 0, MAX_SYNTHID_TOP_K)

    @classmethod
    def parse(cls, text: str) -> SynthIDSpec:
        """``synthid:h=4,layers=30,top_k=40,prf=hmac-sha256,dedup=true``; fields left out take their defaults."""
        fields = _fields_of(text, "synthid")
        return cls(**_fields(fields, {"h": ("context_width", int), "context_width": ("context_width", int),
                                      "layers": ("layers", int), "prf": ("prf", str), "top_k": ("top_k", int),
                                      "dedup": ("dedup", bool)}, "synthid"))

    @kept_text
    def format(self) -> str:
        return (f"synthid:h={self.context_width},layers={self.layers},top_k={self.top_k},prf={self.prf},"
                f"dedup={str(self.dedup).lower()}")

    needs_key = True


@dataclass(frozen=True, slots=True)
class HFSynthIDSpec(_SpecValue):
    """transformers' ``SynthIDTextWatermarkingConfig``, field for field (keys are public integers)."""

    keys: tuple[int, ...]
    ngram_len: int = 5
    sampling_table_seed: int = 0
    sampling_table_size: int = 2**16
    context_history_size: int = 1024
    skip_first_ngram_calls: bool = False
    kind: str = field(default="hf:synthid", init=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.keys, tuple) or not 1 <= len(self.keys) <= MAX_HF_LAYERS:
            raise SpecError(f"keys: expected 1..{MAX_HF_LAYERS} integers, got {self.keys!r}")
        for key in self.keys:
            _check_int_range("keys", key, -(2**63), 2**63 - 1)
        _check_int_range("ngram_len", self.ngram_len, 2, MAX_SAMPLING_CONTEXT + 1)
        _check_int_range("sampling_table_seed", self.sampling_table_seed, 0, 2**63 - 1)
        _check_int_range("sampling_table_size", self.sampling_table_size, 2, HF_SYNTHID_TABLE_MAX)
        _check_int_range("context_history_size", self.context_history_size, 1, 1 << 20)

    @property
    def context_width(self) -> int:
        return self.ngram_len - 1

    @property
    def layers(self) -> int:
        return len(self.keys)

    @classmethod
    def parse(cls, text: str) -> HFSynthIDSpec:
        """``hf:synthid,keys=K1:K2:...,ngram_len=5,...``: transformers' config, field for field."""
        fields = _fields_of(text, "hf", "synthid")
        if "keys" not in fields or not fields["keys"]:
            raise SpecError("keys: hf:synthid needs keys=K1:K2:... (transformers' watermarking keys)")
        keys = tuple(_parse_int("keys", k) for k in fields.pop("keys").split(":"))
        values = _fields(fields, {"ngram_len": ("ngram_len", int), "sampling_table_seed": ("sampling_table_seed", int),
                                  "sampling_table_size": ("sampling_table_size", int),
                                  "context_history_size": ("context_history_size", int),
                                  "skip_first_ngram_calls": ("skip_first_ngram_calls", bool)}, "hf:synthid")
        return cls(keys=keys, **values)

    @kept_text
    def format(self) -> str:
        return (f"hf:synthid,keys={':'.join(str(k) for k in self.keys)},ngram_len={self.ngram_len},"
                f"sampling_table_seed={self.sampling_table_seed},sampling_table_size={self.sampling_table_size},"
                f"context_history_size={self.context_history_size},"
                f"skip_first_ngram_calls={str(self.skip_first_ngram_calls).lower()}")

    needs_key = False


@dataclass(frozen=True, slots=True)
class VLLMGumbelSpec(_SpecValue):
    """vLLM's ``WatermarkConfig(algorithm="gumbel", prf="philox")``; the key comes from the keyring."""

    context_width: int = 4
    dedup: bool = True  # vLLM's GumbelWatermarkDetector(deduplicate_contexts=True), its default
    kind: str = field(default="vllm:gumbel", init=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_width(self.context_width, VLLM_MAX_CONTEXT)

    @classmethod
    def parse(cls, text: str) -> VLLMGumbelSpec:
        """``vllm:gumbel,context_width=4,dedup=true``."""
        fields = _fields_of(text, "vllm", "gumbel",
                            "vllm: only vLLM's gumbel watermark is supported (vllm:gumbel,...)")
        return cls(**_fields(fields, {"context_width": ("context_width", int), "h": ("context_width", int),
                                      "dedup": ("dedup", bool)}, "vllm:gumbel"))

    @kept_text
    def format(self) -> str:
        return f"vllm:gumbel,context_width={self.context_width},dedup={str(self.dedup).lower()}"

    needs_key = True


SamplingSpec = GumbelSpec | SynthIDSpec | HFSynthIDSpec | VLLMGumbelSpec


def sampling_fingerprint(spec: SamplingSpec, vocab_size: int) -> str:
    """A stable 128-bit hex digest of the canonical spec and V (as ``WatermarkSpec.fingerprint``)."""
    if not isinstance(vocab_size, int) or vocab_size <= 0:
        raise SpecError(f"vocab_size: expected a positive integer, got {vocab_size!r}")
    return hashlib.sha256(f"provmark-spec/v1|{spec.format()}|V={vocab_size}".encode()).hexdigest()[:32]


def vllm_key_from_secret(secret: bytes) -> int:
    """The 64-bit integer a keyring key is configured as in vLLM (``--watermark-config '{"key": N}'``).

    Domain-separated, so it reveals nothing about the key's KGW or Gumbel seeds."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
        raise ValueError("watermark key: expected at least 16 secret bytes")
    return int.from_bytes(hashlib.sha256(b"provmark/vllm-key/v1\x00" + bytes(secret)).digest()[:8], "little")


def _fields_of(text: str, prefix: str, tag: str | None = None, missing_tag: str | None = None) -> dict:
    """The fields of a spec string of this prefix (and leading tag: ``hf:synthid,...``); SpecError otherwise."""
    kind, fields = split_spec(text, MAX_HF_SPEC_CHARS, "gumbel:h=4,prf=hmac-sha256", "the kind prefix")
    if kind != prefix or (tag is not None and not _take_tag(fields, tag)):
        if missing_tag is not None and kind == prefix:
            raise SpecError(missing_tag)
        raise SpecError(f"kind: expected {prefix}:{tag + ',...' if tag else '...'}, got {text[:40]!r}")
    return fields


def _take_tag(fields: dict[str, str | None], tag: str) -> bool:
    if tag in fields and fields[tag] is None:
        del fields[tag]
        return True
    return False


def _fields(fields: dict[str, str | None], names: dict[str, tuple[str, type]], kind: str) -> dict:
    values: dict = {}
    for name, raw in fields.items():
        if name not in names:
            raise SpecError(f"{name}: unknown field for {kind} (known: {', '.join(names)})")
        target, typ = names[name]
        if target in values:
            raise SpecError(f"{name}: given twice")
        if typ is bool:
            values[target] = True if raw is None else _parse_bool(name, raw)
        elif raw is None:
            raise SpecError(f"{name}: expected {name}=VALUE")
        elif typ is int:
            values[target] = _parse_int(name, raw)
        elif typ is float:
            values[target] = _parse_float(name, raw)
        else:
            values[target] = raw.lower()
    return values


def _check_width(width, upper: int) -> None:
    _check_int_range("h", width, 1, upper)


def _check_prf(prf) -> None:
    if prf not in PRFS:
        raise SpecError(f"prf: expected one of {', '.join(PRFS)}, got {prf!r}")


def _check_int_range(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(f"{name}: expected an integer in {low}..{high}, got {value!r}")
