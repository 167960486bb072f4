"""The one verdict builder: every scheme's scoring (``detector.kgw_verdict``, ``detector.sampling_verdict``) ends
in an ``Outcome``, what it found, and ``build_verdict`` makes the ``Verdict`` of it with the fields every scheme
fills the same way (the spec, the text's digest and lengths, the decision, the tokenizer, the common-unit table)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from detector.scoring_request import ScoringRequest
from detector.verdict import Verdict


@dataclass(slots=True)
class Outcome:
    """What a scheme's scoring of one text found: the decision and its best key's numbers (``p_value``: corrected
    across keys), every key's line, and the optional parts (windows, explanation, dither, a scheme's own
    statistic or green count, a promise, a two-part key's published half)."""

    verdict: str
    decided_by: str | None  # "text" | "window" when watermarked
    z_score: float
    p_value: float
    p_value_normal: float
    num_tokens_scored: int
    key_id: str | None
    keys: list[dict]
    text_alpha: float  # the whole text's share of alpha
    min_tokens: int
    num_forced_positions: int = 0
    num_common_positions: int = 0
    calibration: dict | None = None
    windows: dict | None = None
    explanation: list[dict] | None = None
    dither: float | None = None
    num_green_tokens: int | None = None  # green-list schemes only
    statistic: dict | None = None  # sampling schemes: their own statistic
    promise: dict | None = None
    public_half: dict | None = None


def build_verdict(request: ScoringRequest, outcome: Outcome) -> Verdict:
    """The Verdict of ``outcome`` for ``request``'s text."""
    total, green = outcome.num_tokens_scored, outcome.num_green_tokens
    common = request.common
    return Verdict(
        verdict=outcome.verdict,
        z_score=outcome.z_score,
        p_value=outcome.p_value,
        p_value_normal=outcome.p_value_normal,
        num_tokens_scored=total,
        num_green_tokens=green,
        green_fraction=green / total if green is not None and total else math.nan,
        key_id=outcome.key_id,
        keys=outcome.keys,
        **request.verdict_fields(outcome.text_alpha, outcome.min_tokens),
        decided_by=outcome.decided_by,
        num_forced_positions=outcome.num_forced_positions,
        num_common_positions=outcome.num_common_positions,
        common_units=common.digest if common is not None else None,
        calibration=outcome.calibration,
        promise=outcome.promise,
        windows=outcome.windows,
        explanation=outcome.explanation,
        statistic=outcome.statistic,
        public_half=outcome.public_half,
        dither=outcome.dither,
        spec=request.spec,
    )
