"""What one verdict's scoring is given (``ScoringRequest``) and gives back (``Scored``), for both families of
schemes: green lists (``detector.kgw_verdict``) and sampling watermarks (``detector.sampling_verdict``).
``Detector.detect`` builds the request once the text is normalised and tokenized and the keys are resolved."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from detector.calibration import Calibration
from detector.common_units import CommonUnits
from detector.normalize import NormalizedText
from detector.scoring import CORRECTION, WINDOW_ALPHA_SHARE, Decision
from detector.verdict import Verdict
from watermark.field_error import FieldError
from watermark.specs import AnySpec
from watermark.stats import Z_THRESHOLD
from watermark.vocab import Vocabulary


@dataclass(frozen=True, slots=True)
class DetectOptions:
    """How ``Detector.detect`` scores a text (see its docstring): windows, per-token explanation, which
    normalisation stages (True: all), n-gram dedup, the decision threshold (``z_threshold`` or ``fpr``), and
    the token indices a constraint forced."""

    windows: bool = False
    explain: bool = False
    normalize: bool | Iterable[str] = True
    dedup: bool = True
    z_threshold: float = Z_THRESHOLD
    fpr: float | None = None
    forced_positions: Iterable[int] | None = None

    def __post_init__(self) -> None:
        for name in ("windows", "explain", "dedup"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(name, f"expected True or False, got {getattr(self, name)!r}")  # noqa: TRY004 (an option)
        if isinstance(self.z_threshold, bool) or not isinstance(self.z_threshold, (int, float)):
            raise FieldError("z_threshold", f"expected a number, got {self.z_threshold!r}")  # noqa: TRY004 (an option)
        if self.fpr is not None and (isinstance(self.fpr, bool) or not isinstance(self.fpr, (int, float))):
            raise FieldError("fpr", f"expected a number or None, got {self.fpr!r}")

    def scoring(self) -> ScoringOptions:
        """These options validated (ValueError names a bad one)."""
        return ScoringOptions(windows=self.windows, explain=self.explain, dedup=self.dedup,
                              normalize=_normalize_option(self.normalize),
                              decision=Decision.make(self.z_threshold, self.fpr),
                              forced_positions=tuple(self.forced_positions or ()))


def _normalize_option(value) -> bool | tuple[str, ...]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return (value,)
    try:
        return tuple(value)
    except TypeError:
        raise FieldError("normalize", f"expected True, False or stage names, got {value!r}") from None


@dataclass(slots=True)
class ScoringOptions:
    """``Detector.detect``'s keyword options, validated at the door."""

    windows: bool
    explain: bool
    dedup: bool
    normalize: bool | tuple[str, ...]
    decision: Decision = field(repr=False)
    forced_positions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("windows", "explain", "dedup"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(name, f"expected True or False, got {getattr(self, name)!r}")
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.forced_positions):
            raise FieldError("forced_positions", "expected token indices (integers >= 0)")

    @property
    def text_alpha(self) -> float:
        """The whole text's share of alpha: all of it, or what the windows leave (they get WINDOW_ALPHA_SHARE)."""
        alpha = self.decision.alpha
        return alpha * (1.0 - WINDOW_ALPHA_SHARE) if self.windows else alpha

    @property
    def window_alpha(self) -> float:
        return self.decision.alpha * WINDOW_ALPHA_SHARE


@dataclass(slots=True)
class ScoringRequest:
    """One text, scored under the watermarks of the keys being tested (one public watermark for an hf spec)."""

    text: str  # as given: the verdict's digest, and the explanation's pieces, are of this text
    normalized: NormalizedText
    ids: torch.Tensor  # int64 [N], the normalised text's tokens
    offsets: list | None  # per token, (start, end) in the normalised text; only when windows or explain ask
    marks: list  # watermark.scheme.Watermark or a sampling watermark, one per key
    spec: AnySpec
    vocab: Vocabulary
    options: ScoringOptions
    calibrations: list[Calibration | None]  # per mark, measured under ``common`` (else None: uncalibrated)
    common: CommonUnits | None  # the common-unit table (Detector.common_units_for); None counts every position
    dither_key: bytes | None = None  # the detect-scope dither's (detector.disclosure.dither)
    keep_spoof_units: bool = False  # a positive verdict hands back its scored units for the spoof check
    matches: list | None = None  # per mark, a db.output_grams MatchRequest (or None) its kgw scoring pass answers

    def spans(self) -> np.ndarray | None:
        """Each token's (start, end) in the ORIGINAL text; None when no offsets were asked for."""
        if self.offsets is None:
            return None
        return self.normalized.original_spans(np.asarray(self.offsets, dtype=np.int64).reshape(-1, 2))

    def verdict_fields(self, alpha: float, min_tokens: int) -> dict:
        """The Verdict fields every scheme fills the same way: the spec and its fingerprint, the text's
        digest and lengths, the decision's alpha and threshold, the tokenizer and the normalisations."""
        vocab = self.vocab
        return {"watermark": self.spec.format(), "fingerprint": self.marks[0].fingerprint,
                "num_tokens": int(self.ids.shape[0]), "alpha": alpha,
                "z_threshold": self.options.decision.z_threshold, "min_tokens": min_tokens,
                "dedup": self.options.dedup, "correction": CORRECTION, "normalizations": list(self.normalized.changes),
                "tokenizer_fingerprint": vocab.fingerprint, "model_id": vocab.model_id,
                "text_sha256": hashlib.sha256(self.text.encode("utf-8", "surrogatepass")).hexdigest(),
                "text_length": len(self.text)}


@dataclass(slots=True)
class Scored:
    """A verdict and, when the request kept them and the verdict is positive (deduplicated, with a common-unit
    table), its best key's scored units: (green flags or sampling values, key-free identities, previous
    occurrences with forced positions still counted), the spoof check's input (``detector.spoof_check``)."""

    verdict: Verdict
    spoof_units: tuple | None = None


def current_calibrations(calibrations: list[Calibration | None], common: CommonUnits | None
                         ) -> list[Calibration | None]:
    """The calibrations measured under this scoring's common-unit table; a null measured under another
    table is not this scoring's null: such a key counts as uncalibrated until `keys calibrate` again."""
    digest = common.digest if common is not None else None
    return [c if c is not None and c.common_units == digest else None for c in calibrations]
