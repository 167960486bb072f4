"""A watermark for a spec: ``make_watermark`` (spec + key material -> the family's watermark) and
``generation_watermark`` (what a generation request uses: the named or active key, its bound spec). The green-list
watermark itself is ``watermark.green_watermark.Watermark``."""

from __future__ import annotations

from watermark import schemes
from watermark.field_error import FieldError
from watermark.green_watermark import Watermark
from watermark.key_binding import bound_spec
from watermark.key_info import KeyNotFoundError
from watermark.keys import Keyring
from watermark.specs import AnySpec, parse_spec

__all__ = ["Watermark", "generation_watermark", "make_watermark"]


def make_watermark(spec: AnySpec | str | None, secret: bytes | None, vocab_size: int, key_id: str | None = None,
                   public_half: bytes | None = None):
    """The watermark of any spec (``watermark.specs.parse_spec``), made by its family (``watermark.schemes``).
    ``public_half``: a two-part key's detection half (a family with ``two_part``: kgw)."""
    spec = parse_spec(spec)
    family = schemes.family_of(spec)
    if public_half is not None and not family.two_part:
        raise ValueError(f"a two-part key needs a kgw spec, not {family.name}")
    return family.make(spec, secret, vocab_size, key_id, public_half)


def generation_watermark(spec: AnySpec | str | None, vocab_size: int, key_id: str | None = None,
                         keyring=None, create_if_missing: bool = False):
    """The Watermark a generation request uses: ``spec`` (None: the key's own spec) under the named
    key, or under the keyring's active key. hf specs need no key. Sampling specs (gumbel, synthid, ...)
    give their sampling watermark (see ``make_watermark``).

    Raises ``watermark.key_info.KeyNotFoundError`` for an unknown key or one not usable for
    generation (retired); ``create_if_missing`` makes a first key on an empty keyring."""
    own_spec = spec is None  # the key's own spec (the default spec for the keys made before specs were bound)
    spec = parse_spec(spec)
    if not spec.needs_key:
        if key_id is not None:
            raise FieldError("key", "hf specs carry their own hashing_key; do not name a keyring key")
        return make_watermark(spec, None, vocab_size)
    keyring = keyring if keyring is not None else Keyring()
    if key_id is None:
        info = keyring.ensure_active() if create_if_missing else keyring.active()
    else:
        info = next((k for k in keyring.list() if k.key_id == key_id), None)
        if info is None or not info.usable_for_generation:
            state = "unknown" if info is None else info.status
            raise KeyNotFoundError(f"key {key_id!r} cannot be used for generation ({state})")
    if own_spec:
        spec = bound_spec(info)
    public_half = keyring.public_half(info.key_id) if info.public_half else None
    return make_watermark(spec, keyring.secret(info.key_id), vocab_size, key_id=info.key_id, public_half=public_half)
