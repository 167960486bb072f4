"""The verdict of a green-list spec (``kgw:``, ``hf:``): green flags, dedup, G of T, z and the exact binomial p
per key, each key's p-value held to its calibration guard and the verdict's promise (``detector.promise``), Holm
across keys, then optionally the best window (WinMax), what a
two-part key's published half says, and a per-token explanation with offsets into the original text.
The sampling watermarks' verdict is ``detector.sampling_verdict``; both take a ``ScoringRequest``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from detector import common_units
from detector import windows as winmax
from detector.calibration import verdict_calibration
from detector.disclosure import dither
from detector.promise import held_p_value, promise_for, promised_p_value, text_kind
from detector.scoring import (
    WATERMARKED,
    correct_across_keys,
    counted_positions,
    effective_z,
    forced_scored_positions,
    min_scored_tokens,
    score_counts,
    score_positions,
    verdict_of,
)
from detector.scoring_request import Scored, ScoringRequest
from detector.two_part import PrivateScoring, public_half_report
from detector.verdict_builder import Outcome, build_verdict
from watermark.config import WatermarkSpec
from watermark.scheme import Watermark


@dataclass(slots=True)
class _Positions:
    """Every tested key's scored positions, in the text's order (index i is token h + i)."""

    flags: list[np.ndarray]  # green or not, per key
    prevs: list[np.ndarray]  # previous occurrence of the position's unit (itself: not counted), per key
    units: list[np.ndarray]  # dedup units, per key (the dither's input)
    identities: list[np.ndarray | None]  # key-free unit identities, per key, when a common-unit table is used
    unforced: list[np.ndarray]  # prevs before forced positions were taken out (what the spoof check counts)
    forced: np.ndarray  # scored positions the generator could not choose at
    num_common: list[int]  # positions the common-unit table left out, per key


def score_kgw(request: ScoringRequest) -> Scored:
    """The verdict of ``request.ids`` under green-list watermarks ``request.marks`` (one per key, or one public)."""
    marks, options, spec = request.marks, request.options, request.spec
    first = marks[0]
    h = first.context_width
    found = _positions(request, h)
    counted = [counted_positions(prev, True) for prev in found.prevs]
    scores = [score_counts(wm.key_id, int((f & c).sum()), int(c.sum()), spec.gamma)
              for wm, f, c in zip(marks, found.flags, counted)]
    guarded = [False] * len(scores)
    # the promise (detector.promise): keyed verdicts only; its margin is sized by the text's kind, read from its tokens
    kind = text_kind(request.vocab, request.ids.numpy()) if first.key_id is not None else None
    promises = [None if kind is None else promise_for(c, spec.scheme, kind) for c in request.calibrations]
    for i, (score, calibration) in enumerate(zip(scores, request.calibrations)):
        # a key whose measured null is shifted up or wider in this length bucket is held to that null, shifted by
        # its promise's margin
        score.p_value, guarded[i] = promised_p_value(score.p_value, score.z_score, score.num_tokens_scored,
                                                     calibration, promises[i])
    best = correct_across_keys(scores)
    best_index = scores.index(best)
    best_calibration = request.calibrations[best_index]
    total = best.num_tokens_scored

    text_alpha = options.text_alpha
    min_tokens = min_scored_tokens(spec, effective_z(text_alpha, len(marks)))
    verdict = verdict_of(best.p_value_corrected, total, text_alpha, min_tokens)
    decided_by = "text" if verdict == WATERMARKED else None

    spans = request.spans()
    window_report = None
    if options.windows:
        margin = max((p.margin for p in promises if p is not None), default=0.0)
        window_report = _window_report(found.flags, found.prevs, marks, spec, h, spans, options.window_alpha, margin)
        if window_report["detected"] and verdict != WATERMARKED:
            verdict, decided_by = WATERMARKED, "window"

    # the published half is scored as a public verifier scores it: with the shipped table (the deployment's own
    # texts' units are not published)
    private = PrivateScoring(request.ids, common_units.for_spec(spec, request.vocab), options.dedup, found.forced,
                             found.flags, counted)
    public_half = public_half_report(marks, private, text_alpha, min_tokens, verdict)
    spoof_units = None
    if request.keep_spoof_units and verdict == WATERMARKED and options.dedup and request.common is not None:
        spoof_units = (found.flags[best_index], found.identities[best_index], found.unforced[best_index])
    outcome = Outcome(
        verdict=verdict, decided_by=decided_by, z_score=best.z_score, p_value=best.p_value_corrected,
        p_value_normal=min(1.0, best.p_value_normal * len(marks)), num_tokens_scored=total, key_id=best.key_id,
        keys=[s.to_dict() for s in scores], text_alpha=text_alpha, min_tokens=min_tokens,
        num_forced_positions=int(found.forced.shape[0]), num_common_positions=found.num_common[best_index],
        calibration=(None if best_calibration is None
                     else verdict_calibration(best_calibration, total, guarded[best_index])),
        windows=window_report,
        explanation=(_explanation(request.text, request.ids, spans, found.flags[best_index], counted[best_index], h)
                     if options.explain else None),
        dither=(None if request.dither_key is None
                else dither(request.dither_key, first.fingerprint, best.key_id,
                            found.units[best_index][counted[best_index]])),
        num_green_tokens=best.num_green_tokens,
        promise=(None if promises[best_index] is None
                 else promises[best_index].to_dict(guarded[best_index], effective_z(text_alpha, len(marks)))),
        public_half=public_half,
    )
    return Scored(build_verdict(request, outcome), spoof_units)


def _positions(request: ScoringRequest, h: int) -> _Positions:
    """Each key's green flags, dedup units and previous occurrences (dedup units depend on the key for
    minhash/selfhash: they hold the context seed); forced positions point at themselves, so they count nowhere,
    in the text or a window."""
    common, options, matches = request.common, request.options, request.matches
    # with a common-unit table the identities are computed anyway: kept for the spoof check
    with_identities = common is not None
    scored = [score_positions(wm, request.ids, common, options.dedup, with_units=True,
                              with_identities=with_identities, match=None if matches is None else matches[i])
              for i, wm in enumerate(request.marks)]
    flags, prevs, units = ([s[i] for s in scored] for i in range(3))
    identities = [s[3] for s in scored] if with_identities else [None] * len(scored)
    num_common = [int((prev == np.arange(prev.shape[0])).sum()) for prev in prevs]
    forced = forced_scored_positions(options.forced_positions, h, flags[0].shape[0])
    # the spoof check counts what its null counted: first occurrences, forced positions included
    unforced = [prev.copy() for prev in prevs] if forced.shape[0] and request.keep_spoof_units else prevs
    for prev in prevs:
        prev[forced] = forced
    return _Positions(flags, prevs, units, identities, unforced, forced, num_common)


def _window_report(flags: list[np.ndarray], prevs: list[np.ndarray] | None, marks: list[Watermark], spec: WatermarkSpec,
                   h: int, spans: np.ndarray, alpha: float, margin: float = 0.0) -> dict:
    """The best window over every key, Bonferroni-corrected for windows x keys; ``margin``: the verdict's promise's."""
    num_positions = flags[0].shape[0]
    tests = winmax.count_windows(num_positions) * len(marks)
    best = None
    for i, (wm, f) in enumerate(zip(marks, flags)):
        hit = winmax.best_window(f, prevs[i] if prevs is not None else None, spec.gamma)
        if hit is not None and (best is None or (hit.p_value, -hit.z_score) < (best.p_value, -best.z_score)):
            hit.key_id = wm.key_id
            best = hit
    report = {"num_windows_tested": tests, "sizes": winmax.window_sizes(num_positions),
              "stride_divisor": winmax.STRIDE_DIVISOR, "correction": "bonferroni", "alpha": alpha,
              "detected": False, "best": None}
    if best is None:
        return report
    best.p_value = held_p_value(best.p_value, best.z_score, margin)
    best.p_value_corrected = winmax.corrected(best.p_value, tests)
    best.token_start, best.token_end = best.start + h, best.end + h
    best.char_start = int(spans[best.token_start, 0])
    best.char_end = int(spans[best.token_end - 1, 1])
    report["detected"] = best.p_value_corrected <= alpha
    report["best"] = asdict(best)
    return report


def _explanation(text: str, ids: torch.Tensor, spans: np.ndarray, flags: np.ndarray, counted: np.ndarray,
                 h: int) -> list[dict]:
    """Per token: id, original-text span and piece, and (from position h on) its flag (Python lists read once,
    not numpy scalars per token: a 100,000-character text can hold 300,000 tokens)."""
    n = len(ids)
    green = [None] * min(h, n) + [bool(f) for f in np.asarray(flags[:max(0, n - h)]).tolist()]
    kept = [False] * min(h, n) + [bool(c) for c in np.asarray(counted[:max(0, n - h)]).tolist()]
    spans = np.asarray(spans)
    starts, ends = spans[:, 0].tolist(), spans[:, 1].tolist()  # flat: no list per token
    return [{"index": i, "token_id": token_id, "char_start": start, "char_end": end, "text": text[start:end],
             "scored": i >= h, "green": green[i], "counted": kept[i]}
            for i, (token_id, start, end) in enumerate(zip(ids.tolist(), starts, ends))]
