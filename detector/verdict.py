"""``Verdict``: one detection result, its JSON form and what each API scope may see of it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from detector.disclosure import DETECT_SCOPE, EXPLAIN_SCOPE, disclose, unit_variance
from detector.scoring import WATERMARKED


@dataclass(slots=True)
class Verdict:
    """One detection result; ``to_dict()`` is JSON-safe (no NaN) and holds no text and no secret."""

    verdict: str  # watermarked | not_watermarked | insufficient_text
    z_score: float  # whole text, best key (nan when nothing was scored)
    p_value: float  # whole text, exact binomial, Holm-corrected across the keys tested
    p_value_normal: float  # the same from the normal approximation (corrected the same way)
    num_tokens_scored: int  # T: distinct n-grams (dedup) or scorable positions
    num_green_tokens: int | None  # G (None for sampling specs: no colours)
    green_fraction: float  # G / T (nan when T = 0, and for sampling specs)
    key_id: str | None  # the best key (None for hf specs)
    watermark: str  # canonical spec string
    fingerprint: str  # spec fingerprint (spec + V)
    num_tokens: int  # tokens of the normalised text
    alpha: float  # false-positive rate the verdict is held to
    z_threshold: float
    min_tokens: int  # T below which a non-significant text is insufficient_text
    dedup: bool
    correction: str
    keys: list[dict]  # every key tested: z, p, corrected p
    normalizations: list[str]  # normalisation stages that changed the text
    tokenizer_fingerprint: str
    model_id: str
    text_sha256: str  # of the original text
    text_length: int  # characters of the original text
    decided_by: str | None = None  # "text" | "window" when watermarked
    # scorable positions left out because the generator had fewer than two tokens to choose from
    # there (constrained decoding): the watermark could not act on them (see docs/constraints.md)
    num_forced_positions: int = 0
    # scored positions left out because their unit is common in human text, for the best key, and the
    # key-free table that named them (detector.common_units; None for hf specs, which count everything)
    num_common_positions: int = 0
    common_units: str | None = None
    # the best key's calibration (detector.calibration): its id, the length bucket, the null measured
    # there, and whether that null (rather than N(0, 1)) set the p-value; None when the key has none
    calibration: dict | None = None
    # what the p-value promises (detector.promise): "measured" on the deployment's texts of this kind or "bounded" for
    # a collection nobody measured, the text's kind, the margin in z, whether it raised the p-value, and its cost in
    # power (z_needed, tokens_factor); None for public hf specs and the sampling specs
    promise: dict | None = None
    windows: dict | None = None
    explanation: list[dict] | None = None
    # sampling specs: the scheme's own statistic (Gumbel sum; SynthID ones, mean and weighted-mean g)
    statistic: dict | None = None
    # kgw:, gumbel: and synthid: verdicts that say watermarked, where the service keeps its own output
    # (db.output_memory): the spoof check (detector.spoof_check.verdict_spoof_check): z, p-values, null size, suspected
    spoof_check: dict | None = None
    # kgw:, gumbel: and synthid: verdicts where the service keeps its own output: whether the text repeats the
    # wording of one output it wrote under a tested key (db.output_grams.Match.to_dict; independent of colours
    # and of the verdict, which it never changes); None when no tested key has remembered outputs
    own_output: dict | None = None
    # keyed verdicts where the service keeps its outputs' meaning (db.semantic_memory): the remembered output closest
    # to the text in meaning, its similarity, the false-match rate that carries, and when it clears the calibrated
    # threshold that output's receipt id (detector.paraphrase_match; never changes the verdict); None when no tested
    # key has remembered outputs
    paraphrase_of_own_output: dict | None = None
    # two-part keys (watermark.public_key): what the published half says of this text, and the paired test of
    # the two halves that tells a spoof steered by the published half from our own output (detector.two_part)
    public_half: dict | None = None
    # keyed per-text dither of the detect-scope view (detector.disclosure); not part of the verdict itself
    dither: float | None = field(default=None, repr=False)
    spec: object = field(default=None, repr=False, compare=False)  # the spec value scored under (not shown)

    def to_dict(self) -> dict:
        """Every field but ``dither`` and ``spec`` as a new JSON-like tree: ``dataclasses.asdict``'s result, without its deep copy
        of every leaf (45-63 us a verdict there, 6-8 us here): the fields hold plain dicts and lists of immutable
        scalars, and only those containers are copied (``_copied``)."""
        out = {name: _copied(getattr(self, name)) for name in _FIELDS if name != "explanation"}
        # one dict per token, of scalars (a shallow copy is a whole copy) but for SynthID's g_values list
        out["explanation"] = None if self.explanation is None else [
            _copied(e) if "g_values" in e else dict(e) for e in self.explanation]
        return self.finished({name: out[name] for name in _FIELDS})

    def finished(self, out: dict) -> dict:
        """``to_dict`` from the copied fields: the derived bits added, non-finite floats as None (in place)."""
        out["spoof_suspected"] = spoof_suspected(self.watermarked, self.spoof_check, self.public_half)
        out["matches_own_output"] = None if self.own_output is None else self.own_output["matched"]
        for name in ("z_score", "green_fraction", "p_value", "p_value_normal"):
            value = out[name]
            out[name] = float(value) if value is not None and math.isfinite(value) else None
        return out

    @property
    def watermarked(self) -> bool:
        return self.verdict == WATERMARKED

    def disclose(self, scope: str) -> dict:
        """What a caller with ``scope`` may see (``detector.disclosure``): everything for ``explain``
        or ``admin``; for ``detect`` the verdict and a coarse, dithered p-value, no counts."""
        return self.views(scope)[0]

    def views(self, scope: str) -> tuple[dict, dict]:
        """(What a caller with ``scope`` may see, the ``detect`` scope's view) from one ``to_dict``: the service
        shows the first and records the second with every verdict (``db.verdicts``)."""
        if scope not in (DETECT_SCOPE, EXPLAIN_SCOPE, "admin"):
            raise ValueError(f"scope: expected detect, explain or admin, got {scope!r}")
        full = self.to_dict()
        coarse = disclose(full, False, self.dither, unit_variance(self.spec or self.watermark))
        return (coarse if scope == DETECT_SCOPE else full), coarse


_FIELDS = tuple(f.name for f in fields(Verdict) if f.name not in ("dither", "spec"))


def _copied(value):
    """``value`` as ``dataclasses.asdict`` copies a field: dicts and lists copied all the way down, immutable
    scalars shared (deepcopy returns them as they are), anything else through ``asdict`` itself."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {k: _copied(v) for k, v in value.items()}
    if kind is list:
        return [_copied(v) for v in value]
    return asdict(_Holder(value))["value"]  # tuples, dataclasses, numpy scalars...: exactly asdict's copy


@dataclass(slots=True)
class _Holder:
    value: object


_ATOMS = frozenset((str, int, float, bool, type(None)))


def spoof_suspected(watermarked: bool, spoof_check: dict | None, public_half: dict | None) -> bool | None:
    """A positive verdict: the own-output check (``detector.spoof_check``); a negative one under a two-part key:
    whether its published half was spoofed (``detector.two_part``); None when neither can judge."""
    if watermarked:
        return (spoof_check or {}).get("suspected")
    return None if public_half is None else public_half["spoof_suspected"]
