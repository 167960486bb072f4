"""The registry of watermark scheme families: one line per family, each family one module of this package
(``family.py`` says what a family declares). Everything else asks the registry (``family_of(spec)``) instead of
listing scheme kinds or switching on spec types (tests/test_house_rules.py keeps that).

Adding a scheme: its module here (a ``SchemeFamily`` subclass and its ``FAMILY``; its spec type and watermark
may live in their own modules of ``watermark/``), and its line in ``FAMILIES`` (or ``register(FAMILY)`` from
outside, as a plugin or a test does). docs/architecture.md walks through one."""

from __future__ import annotations

import warnings

from watermark.config import SpecError, WatermarkSpec
from watermark.schemes import gumbel, hf, hf_synthid, kgw, synthid, vllm_gumbel
from watermark.schemes.family import SchemeFamily

FAMILIES: list[SchemeFamily] = [
    kgw.FAMILY,
    hf.FAMILY,
    gumbel.FAMILY,
    synthid.FAMILY,
    hf_synthid.FAMILY,
    vllm_gumbel.FAMILY,
]


def register(family: SchemeFamily) -> SchemeFamily:
    """Add a family (a plugin's, a test's); ValueError when its name or spec prefix is taken."""
    taken = {f.name for f in FAMILIES} | {n for f in FAMILIES for n in f.old_names}
    if family.name in taken or any(f.prefix == family.prefix and f.tag == family.tag for f in FAMILIES):
        raise ValueError(f"scheme family {family.name!r}: its name or spec prefix is taken")
    FAMILIES.append(family)
    return family


def unregister(family: SchemeFamily) -> None:
    FAMILIES.remove(family)


def family_named(name: str) -> SchemeFamily:
    """The family of this name; an old spelling (``hf-synthid``) is taken for one release with a
    DeprecationWarning. SpecError for an unknown name."""
    for family in FAMILIES:
        if name == family.name:
            return family
        if name in family.old_names:
            warnings.warn(f"the scheme name {name!r} is deprecated; say {family.name!r}", DeprecationWarning,
                          stacklevel=2)
            return family
    raise SpecError(f"kind: expected one of {', '.join(f.name for f in FAMILIES)}, got {name!r}")


def family_of(spec) -> SchemeFamily:
    """The family of a spec value (by its ``kind``)."""
    for family in FAMILIES:
        if spec.kind == family.name:
            return family
    raise SpecError(f"kind: no scheme family is named {spec.kind!r}")


def family_of_text(text: str) -> SchemeFamily:
    """The family a spec string names by its prefix (and first field); ``kgw`` for a string none claims, whose
    parser then says what is wrong."""
    prefix, _, body = text.strip().partition(":") if isinstance(text, str) else ("", "", "")
    first = body.split(",", 1)[0].strip().lower()
    prefix = prefix.strip().lower()
    return next((f for f in FAMILIES if f.claims(prefix, first)), kgw.FAMILY)


def parse(text: str):
    """The spec a string names, parsed once by its family's own parser; SpecError names what is wrong."""
    return family_of_text(text).parse(text)


def is_sampling(spec) -> bool:
    """True for a spec of a sampling family (the watermark chooses the token); False for anything else."""
    kind = getattr(spec, "kind", None)
    return any(kind == f.name and f.sampling for f in FAMILIES)


def default_spec() -> WatermarkSpec:
    return WatermarkSpec.default()


def presets() -> dict[str, str]:
    """The families' own evaluation presets: name -> spec string."""
    return {f.name: f.evaluation_preset for f in FAMILIES if f.evaluation_preset is not None}
