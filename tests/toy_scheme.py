"""A toy watermark scheme in one module, as docs/architecture.md's walk-through adds one: a keyed race over a
small vocabulary (``toy:h=1``). Its spec parses and prints itself, its watermark chooses tokens and scores them,
and its family (a Gumbel race: Exp(1) values, Gamma tail) says the rest. tests/test_toy_scheme.py registers it
with one line and generates, detects and reads its verdict."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch

from watermark.config import SpecError, kept_fingerprint, kept_text, split_spec
from watermark.schemes.sampling import GumbelRace


@dataclass(frozen=True, slots=True)
class ToySpec:
    context_width: int = 1
    dedup: bool = True
    kind: str = field(default="toy", init=False)
    _text: str | None = field(default=None, init=False, repr=False, compare=False)
    _fingerprints: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    needs_key = True

    @classmethod
    def parse(cls, text: str) -> ToySpec:
        prefix, fields = split_spec(text, 64, "toy:h=1", "the 'toy:' prefix")
        if prefix != "toy" or set(fields) - {"h"}:
            raise SpecError(f"spec: expected toy:h=N, got {text!r}")
        return cls(int(fields.get("h") or 1))

    @kept_text
    def format(self) -> str:
        return f"toy:h={self.context_width}"

    @kept_fingerprint
    def fingerprint(self, vocab_size: int) -> str:
        return hashlib.sha256(f"toy|{self.format()}|{vocab_size}".encode()).hexdigest()[:32]


class ToyMark:
    """r_v = a keyed uniform per (context, token); the token is argmax log(r_v) / p_v; a position scores
    s = -log(1 - r) of its token (Exp(1) when the text ignores the key)."""

    def __init__(self, spec: ToySpec, secret: bytes, vocab_size: int, key_id: str | None = None) -> None:
        self.spec, self.vocab_size, self.key_id, self.secret = spec, vocab_size, key_id, bytes(secret)
        self.fingerprint = spec.fingerprint(vocab_size)
        self.batch_key = (spec, vocab_size, hashlib.sha256(self.secret).digest())

    @property
    def context_width(self) -> int:
        return self.spec.context_width

    def _uniforms(self, context) -> torch.Tensor:
        seed = hashlib.sha256(self.secret + repr([int(t) for t in context]).encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(seed[:8], "little") >> 1)
        return torch.rand(self.vocab_size, generator=generator, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)

    def choose_from_probs(self, probs: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        races = torch.stack([self._uniforms(c).log() for c in contexts]) / probs.double().clamp_min(1e-30)
        return races.argmax(dim=-1)

    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        h = self.context_width
        values = [-torch.log1p(-self._uniforms(ids[i - h:i])[ids[i]]) for i in range(h, ids.shape[0])]
        units = ids.unfold(0, h + 1, 1) if ids.shape[0] > h else ids.new_zeros((0, h + 1))
        return torch.stack(values) if values else torch.zeros(0, dtype=torch.float64), units


class ToyFamily(GumbelRace):
    name = prefix = "toy"
    spec_type = ToySpec
    example = "toy:h=1"

    def make(self, spec, secret, vocab_size, key_id=None, public_half=None):
        return ToyMark(spec, secret, vocab_size, key_id)


FAMILY = ToyFamily()
