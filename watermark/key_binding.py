"""A key is bound to the spec it watermarks with, so its colours cannot be probed under other specs.

Whoever may score text under a key with a spec of their choice learns the key's colours through
that spec: ``selfhash, h=1`` seeds predict ``h=4`` colours, and stepping ``gamma`` locates a unit's
green/red boundary. So a key records its spec (``KeyInfo.spec``) and is scored only under a spec
with the same colours: same scheme, h, gamma and PRF. ``delta`` and ``hard`` change how strongly
generation favours green tokens, never which tokens are green, so a detection request may differ
there (they only move the length below which a negative is ``insufficient_text``).

``hf:`` specs carry their own public key and no keyring secret: they are never bound. A key may be
bound to a sampling spec (``gumbel:``, ``synthid:``, ``vllm:gumbel``); its colours are then what decides
its random values: kind, h and PRF (and the layer count for synthid), not ``dedup`` or ``top_k``.
"""

from __future__ import annotations

import functools

from watermark.config import WatermarkSpec
from watermark.key_info import KeyInfo, KeySpecError
from watermark.specs import AnySpec, is_sampling, parse_spec

LEGACY_DEFAULT = WatermarkSpec()  # the default spec before code_delta (the dataclass defaults)


def spec_to_bind(spec: AnySpec | str | None) -> str:
    """The canonical spec string a new key records (the default spec when None); only keyed specs."""
    parsed = parse_spec(spec)
    if not parsed.needs_key:
        raise KeySpecError("an hf spec carries its own public key: a keyring key cannot be bound to it")
    return parsed.format()


def bound_spec(info: KeyInfo) -> AnySpec:
    """The spec ``info``'s key watermarks with. Keys made before specs were recorded watermark with the default spec
    as it was then, without ``code_delta``: their spec, fingerprint and stored calibrations stay what they were."""
    if info.spec is None:
        return LEGACY_DEFAULT
    return _parsed(info.spec)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> AnySpec:
    """A key's recorded spec string, parsed once per process (spec values are frozen)."""
    return parse_spec(text)


def colour_fields(spec: AnySpec) -> tuple:
    """What decides the key's random values. KGW: scheme, h, gamma, PRF (not delta, not hard).
    Gumbel / vllm:gumbel: kind, h, PRF. SynthID: kind, h, layers, PRF (not dedup, not top_k)."""
    if is_sampling(spec):
        return (spec.kind, spec.context_width, getattr(spec, "prf", None), getattr(spec, "layers", None))
    return (spec.kind, spec.scheme, spec.context_width, spec.gamma, spec.prf)


def same_colours(a: AnySpec, b: AnySpec) -> bool:
    return colour_fields(a) == colour_fields(b)


def require_bound(info: KeyInfo, spec: AnySpec) -> None:
    """KeySpecError (naming the key and its own spec, both public) unless ``spec`` is ``info``'s."""
    own = bound_spec(info)
    if not same_colours(own, spec):
        raise KeySpecError(f"key {info.key_id} is bound to {own.format()} and is scored only under it "
                           f"(asked: {spec.format()})")


def require_generation_bound(mark, keyring) -> None:
    """KeySpecError (a ValueError naming the key, its spec and the fix) when a generation watermark's keyring
    key is bound to other colours. Text written under a key is a sample of that key's colours: a caller free
    to pick ``selfhash, h=1`` under the production key would get text whose statistics predict its ``h=4``
    colours, and the detector would never verify it. hf specs (no keyring key) pass."""
    key_id = getattr(mark, "key_id", None)
    if mark is None or key_id is None:
        return
    info = next((k for k in keyring.list() if k.key_id == key_id), None)
    if info is None:
        return
    try:
        require_bound(info, mark.spec)
    except KeySpecError as exc:
        raise KeySpecError(f"{exc}; name no spec to use the key's own, or create a key for this spec "
                           f"(`provmark keys create --spec {mark.spec.format()}`)") from None


def shared_spec(infos: list[KeyInfo]) -> AnySpec | None:
    """The spec the keys ``infos`` are bound to (a request naming keys and no spec is scored under it, as
    generation writes a key's own spec when none is named); None for no keys; KeySpecError naming each
    key's spec when they are bound to different colours (the caller must say which spec to test)."""
    if not infos:
        return None
    first = bound_spec(infos[0])
    if any(not same_colours(first, bound_spec(info)) for info in infos[1:]):
        owned = ", ".join(f"{info.key_id}: {bound_spec(info).format()}" for info in infos)
        raise KeySpecError(f"the keys are bound to different specs ({owned}); name the spec to test")
    return first


def keys_bound_to(infos: list[KeyInfo], spec: AnySpec) -> list[KeyInfo]:
    """The keys of ``infos`` bound to ``spec``; KeySpecError naming each key's spec when there is none."""
    found = [info for info in infos if same_colours(bound_spec(info), spec)]
    if infos and not found:
        owned = ", ".join(f"{info.key_id}: {bound_spec(info).format()}" for info in infos)
        raise KeySpecError(f"no detection key is bound to {spec.format()} (keys are scored only under their "
                           f"own spec; {owned})")
    return found
