"""The verdict of a sampling-watermark spec (``gumbel:``, ``synthid:``, ``hf:synthid``, ``vllm:gumbel``).

Same shape as KGW's verdict (``detector.kgw_verdict``) where it makes sense: the exact p-value of the best
key (Gamma tail for Gumbel, binomial for SynthID, ``detector.scoring_sampling``), Holm across keys,
guarded by the key's calibration, ``z_score`` = the normal quantile of that p-value, T = counted units,
windows (WinMax) at half of alpha as for KGW. The scheme's own statistic (Gumbel sum, SynthID ones,
mean and weighted-mean g) is in ``statistic`` and per-token values in ``explanation``: the ``detect``
scope sees neither (``detector.disclosure``). ``num_green_tokens`` is None: there are no colours.
"""

from __future__ import annotations

import math

import numpy as np

from detector.calibration import guarded_p_value, verdict_calibration
from detector.disclosure import dither, dither_sorted, z_of
from detector.scoring import WATERMARKED, effective_z, forced_scored_positions, verdict_of
from detector.scoring_request import Scored, ScoringRequest
from detector.scoring_sampling import SampledPositions, counted_score, sampled_positions, window_of
from detector.verdict_builder import Outcome, build_verdict
from detector.windows import STRIDE_DIVISOR, count_windows, window_sizes
from watermark.schemes import family_of
from watermark.stats import holm, p_value_normal


def min_scored_units(mark, z_threshold: float) -> int:
    """Counted units below which a negative is not informative (``insufficient_text``): the first T at
    which watermarked text at the family's reference position (``reference_unit_z``) is expected to reach
    ``z_threshold``."""
    per_unit = family_of(mark.spec).reference_unit_z(mark)
    return max(1, math.ceil(z_threshold**2 / per_unit**2 - 1e-9))


def statistic_of(mark, score) -> dict:
    """The scheme's own statistic of one score (explain scope only), as its family states it."""
    return family_of(mark.spec).statistic(mark, score)


def score_sampling(request: ScoringRequest) -> Scored:
    """The verdict of ``request.ids`` under sampling watermarks ``request.marks`` (one per key; one for
    hf:synthid); a positive one's spoof units are (values, key-free identities, previous occurrences)."""
    marks, options, ids, calibrations, common = (request.marks, request.options, request.ids, request.calibrations,
                                                 request.common)
    first = marks[0]
    keep = request.keep_spoof_units and options.dedup and common is not None
    scored = [sampled_positions(mark, ids, options.dedup, common, with_identities=keep) for mark in marks]
    num_positions = scored[0].values.shape[0]
    # token index of scored position 0: h, except vllm:gumbel, which scores every token (padded contexts)
    h = int(ids.shape[0]) - num_positions if num_positions else first.context_width
    num_common = [int((s.prev == np.arange(s.prev.shape[0])).sum()) for s in scored]
    forced = forced_scored_positions(options.forced_positions, h, num_positions)
    # the spoof check counts what its null counted: first occurrences, forced positions included
    unforced = [s.prev.copy() if forced.shape[0] else s.prev for s in scored] if keep else None
    for s in scored:  # a position that points at itself counts nowhere, in the text or a window
        s.prev[forced] = forced
    scores = [counted_score(mark, s.values, s.prev) for mark, s in zip(marks, scored)]
    guarded = [False] * len(scores)
    for i, (score, calibration) in enumerate(zip(scores, calibrations)):
        # the calibration measured this key's null of z = the normal quantile of the exact p (see calibrate)
        score.p_value, guarded[i] = guarded_p_value(score.p_value, z_of(score.p_value),
                                                    score.num_tokens_scored, calibration)
    adjusted = _holm(scores)
    best_index = min(range(len(scores)), key=lambda i: (scores[i].p_value, -scores[i].num_tokens_scored))
    best = scores[best_index]
    total = best.num_tokens_scored

    text_alpha = options.text_alpha
    min_tokens = min_scored_units(first, effective_z(text_alpha, len(marks)))
    verdict = verdict_of(adjusted[best_index], total, text_alpha, min_tokens)
    decided_by = "text" if verdict == WATERMARKED else None

    spans = request.spans()
    window_report = None
    if options.windows:
        window_report = _window_report(marks, scored, h, spans, options.window_alpha)
        if window_report["detected"] and verdict != WATERMARKED:
            verdict, decided_by = WATERMARKED, "window"

    chosen = scored[best_index]
    values, prev, units, order = chosen.values, chosen.prev, chosen.units, chosen.order
    counted = prev < 0
    spoof_units = (values, chosen.identities, unforced[best_index]) if keep and verdict == WATERMARKED else None
    best_calibration = calibrations[best_index]
    dither_key = request.dither_key
    outcome = Outcome(
        verdict=verdict, decided_by=decided_by, z_score=z_of(best.p_value) if total else float("nan"),
        p_value=adjusted[best_index],
        p_value_normal=min(1.0, p_value_normal(best.z_score) * len(marks)) if total else 1.0,
        num_tokens_scored=total, key_id=best.key_id,
        keys=[_key_dict(mark, score, p) for mark, score, p in zip(marks, scores, adjusted)],
        text_alpha=text_alpha, min_tokens=min_tokens,
        num_forced_positions=int(forced.shape[0]), num_common_positions=num_common[best_index],
        calibration=(None if best_calibration is None
                     else verdict_calibration(best_calibration, total, guarded[best_index])),
        windows=window_report,
        explanation=_explanation(request.text, ids, spans, values, counted, h, first) if options.explain else None,
        dither=None if dither_key is None else _dither(dither_key, first.fingerprint, best.key_id, units, order,
                                                       counted),
        statistic=statistic_of(marks[best_index], best),
    )
    return Scored(build_verdict(request, outcome), spoof_units)


def _dither(dither_key: bytes, fingerprint: str, key_id: str | None, units: np.ndarray, order: np.ndarray | None,
            counted: np.ndarray) -> float:
    """``dither`` of the counted units, taking them in the order dedup sorted them in (when it did)."""
    if order is None:
        return dither(dither_key, fingerprint, key_id, units[counted])
    return dither_sorted(dither_key, fingerprint, key_id, units[order[counted[order]]])


def _holm(scores: list) -> list[float]:
    adjusted = holm([s.p_value for s in scores])
    for score, p in zip(scores, adjusted):
        score.p_value_corrected = p
    return adjusted


def _key_dict(mark, score, corrected: float) -> dict:
    t = score.num_tokens_scored
    return {"key_id": score.key_id, "num_tokens_scored": t, "z_score": z_of(score.p_value) if t else None,
            "p_value": score.p_value, "p_value_corrected": corrected, "statistic": statistic_of(mark, score)}


def _window_report(marks: list, scored: list[SampledPositions], h: int, spans, alpha: float) -> dict:
    """The best window over every key, Bonferroni-corrected for windows x keys (as KGW's)."""
    num_positions = scored[0].values.shape[0]
    report = {"num_windows_tested": count_windows(num_positions) * len(marks), "sizes": window_sizes(num_positions),
              "stride_divisor": STRIDE_DIVISOR, "correction": "bonferroni", "alpha": alpha,
              "detected": False, "best": None}
    best, best_mark = None, None
    for mark, found in zip(marks, scored):
        hit = window_of(mark, found.values, found.prev, tests_other_keys=len(marks))
        if hit is not None and (best is None or hit.p_value < best.p_value):
            best, best_mark = hit, mark
    if best is None:
        return report
    token_start, token_end = best.start + h, best.end + h
    report["detected"] = best.p_value_corrected <= alpha
    report["best"] = {"key_id": best.key_id, "start": best.start, "end": best.end, "token_start": token_start,
                      "token_end": token_end, "char_start": int(spans[token_start, 0]),
                      "char_end": int(spans[token_end - 1, 1]), "num_tokens_scored": best.num_tokens_scored,
                      "z_score": z_of(best.p_value), "p_value": best.p_value,
                      "p_value_corrected": best.p_value_corrected, "statistic": statistic_of(best_mark, best)}
    return report


def _explanation(text: str, ids, spans, values: np.ndarray, counted: np.ndarray, h: int, mark) -> list[dict]:
    """Per token: id, original-text span and piece, and (from position h on) its value: the Gumbel score
    s = -log(1 - r) or the SynthID g-values (one per layer)."""
    field = family_of(mark.spec).explanation_field  # "score" (Gumbel's s) or "g_values" (one per layer)
    out = []
    for i, token_id in enumerate(ids.tolist()):
        start, end = int(spans[i, 0]), int(spans[i, 1])
        scored = i >= h
        entry = {"index": i, "token_id": token_id, "char_start": start, "char_end": end, "text": text[start:end],
                 "scored": scored, "green": None, "counted": bool(counted[i - h]) if scored else False}
        value = values[i - h] if scored else None
        entry[field] = None if value is None else (value.tolist() if np.ndim(value) else float(value))
        out.append(entry)
    return out
