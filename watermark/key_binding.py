"""A key is bound to the spec it watermarks with (issue #17, ARCHITECTURE.md "The PRF contract, tightened").

Whoever may score text under a key with a spec of their choice learns the key's colours through
that spec: ``selfhash, h=1`` seeds predict ``h=4`` colours, and stepping ``gamma`` locates a unit's
green/red boundary. So a key records its spec (``KeyInfo.spec``) and is scored only under a spec
with the same colours: same scheme, h, gamma and PRF. ``delta`` and ``hard`` change how strongly
generation favours green tokens, never which tokens are green, so a detection request may differ
there (they only move the length below which a negative is ``insufficient_text``).

``hf:`` specs carry their own public key and no keyring secret: they are never bound.
"""

from __future__ import annotations

from watermark.config import WatermarkSpec
from watermark.key_info import KeyInfo, KeySpecError


def spec_to_bind(spec: WatermarkSpec | str | None) -> str:
    """The canonical spec string a new key records (the default spec when None); only kgw specs."""
    parsed = WatermarkSpec.default() if spec is None else WatermarkSpec.parse(spec)
    if not parsed.needs_key:
        raise KeySpecError("an hf spec carries its own public hashing_key: a keyring key cannot be bound to it")
    return parsed.format()


def bound_spec(info: KeyInfo) -> WatermarkSpec:
    """The spec ``info``'s key watermarks with (the default spec for keys made before specs were recorded)."""
    return WatermarkSpec.default() if info.spec is None else WatermarkSpec.parse(info.spec)


def colour_fields(spec: WatermarkSpec) -> tuple:
    """What decides the green lists: scheme, h, gamma, PRF (not delta, not hard)."""
    return (spec.kind, spec.scheme, spec.context_width, spec.gamma, spec.prf)


def same_colours(a: WatermarkSpec, b: WatermarkSpec) -> bool:
    return colour_fields(a) == colour_fields(b)


def require_bound(info: KeyInfo, spec: WatermarkSpec) -> None:
    """KeySpecError (naming the key and its own spec, both public) unless ``spec`` is ``info``'s."""
    own = bound_spec(info)
    if not same_colours(own, spec):
        raise KeySpecError(f"key {info.key_id} is bound to {own.format()} and is scored only under it "
                           f"(asked: {spec.format()})")


def keys_bound_to(infos: list[KeyInfo], spec: WatermarkSpec) -> list[KeyInfo]:
    """The keys of ``infos`` bound to ``spec``; KeySpecError naming each key's spec when there is none."""
    found = [info for info in infos if same_colours(bound_spec(info), spec)]
    if infos and not found:
        owned = ", ".join(f"{info.key_id}: {bound_spec(info).format()}" for info in infos)
        raise KeySpecError(f"no detection key is bound to {spec.format()} (keys are scored only under their "
                           f"own spec; {owned})")
    return found
