"""What our keyed sampling watermarks (``gumbel:``, ``synthid:``) share: a spec, a keyring secret, V, and
the per-context seeds of our PRF (``watermark.keyed_words``), domain-separated by the scheme's tag."""

from __future__ import annotations

from watermark.keyed_words import ContextSeeds
from watermark.sampling_specs import sampling_fingerprint
from watermark.seeding import secret_digest


class KeyedSamplingWatermark:
    """Base of ``GumbelWatermark`` and ``SynthIDWatermark``: ``SCHEME`` (the PRF's scheme tag) and
    ``SPEC_TYPE`` (the spec class it takes) are the subclass's."""

    SCHEME = ""
    SPEC_TYPE: type = object

    def __init__(self, spec, secret: bytes, vocab_size: int, key_id: str | None = None) -> None:
        self.spec = self.SPEC_TYPE.parse(spec) if isinstance(spec, str) else spec
        name = type(self).__name__
        if not isinstance(self.spec, self.SPEC_TYPE):
            raise ValueError(f"{name} needs a {self.SCHEME}: spec, got {self.spec.format()!r}")
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        if not secret:
            raise ValueError(f"a {self.SCHEME} watermark needs a key: create one with `provmark keys create`")
        self.vocab_size = vocab_size
        self.key_id = key_id
        self.fingerprint = sampling_fingerprint(self.spec, vocab_size)
        self._seeds = ContextSeeds(bytes(secret), self.spec.prf, self.SCHEME)
        # rows whose watermarks share spec and key are served by one vectorised call (generation stage)
        self.batch_key = (self.spec, vocab_size, secret_digest(bytes(secret)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.format()!r}, key_id={self.key_id!r}, V={self.vocab_size})"

    def clear_seed_cache(self) -> None:
        """Forget the cached per-context seeds: the next texts pay one PRF call per context again."""
        self._seeds.clear()

    @property
    def context_width(self) -> int:
        return self.spec.context_width
