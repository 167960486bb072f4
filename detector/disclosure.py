"""What a verdict tells each caller, so the detector is no colour oracle: the ``detect`` scope gets what a user needs, no more.

A caller who can read exact counts or an exact z learns colours: a text with one scored unit turns
``num_green_tokens`` into that unit's colour, and two texts that differ in one unit differ in G by
that unit's colour. So a ``detect``-scope verdict carries:

* the verdict, and for ``watermarked`` the key and (with windows) where the watermarked passage is;
* for ``insufficient_text``: no score at all;
* otherwise a **dithered, coarse z** (and its normal p-value): with u in [0, 1) drawn by a keyed PRF
  from the text's counted units (the same text always gets the same u; a caller cannot re-draw it by
  resending, only by changing what is scored), ``z_shown = z_thr + w * floor((z - z_thr) / w - u)``
  where the step ``w = STEP_UNITS * d`` is STEP_UNITS green-count units, ``d = 1 / sqrt(T gamma (1 - gamma))``
  being what one unit's colour moves z by (0.16 at T = 200, gamma 0.25; w = 1.3 there).
  For the sampling specs (``gumbel:``, ``synthid:``, ``hf:synthid``, ``vllm:gumbel``) a unit has no colour
  but a value (a Gumbel score s ~ Exp(1), or m SynthID g-values); ``d = 2 / sqrt(T)``, what a typical
  one-unit change (two of the unit's standard deviations) moves z by (``unit_variance``: 1/4 in place of
  gamma (1 - gamma)); z there is the normal quantile of the exact p-value (detector.sampling_verdict).
  ``z_shown <= z`` always, so the p-value shown is an upper bound (conservative) and the false-positive
  rate is never above alpha; the verdict shown is ``z_shown >= z_thr``. A one-unit change moves
  ``z_shown`` with probability ``1 / STEP_UNITS`` at any length: one query no longer reads it, and
  averaging needs about STEP_UNITS^2 fresh texts per unit, each charged to the caller's daily budget
  (``db.budget``). The price: a watermarked text is shown as such for certain only from
  ``z >= z_thr + w`` (5.3 at T = 200); between the two, with probability ``(z - z_thr) / w``.

Fields per scope (``DETECT_FIELDS`` below; ``explain`` and ``admin`` see ``Verdict.to_dict()`` whole):

    always      verdict, watermark, fingerprint, num_tokens, alpha, z_threshold, min_tokens, dedup,
                correction, normalizations, tokenizer_fingerprint, model_id, text_sha256,
                text_length, common_units, disclosure, matches_own_output (one bit: the text repeats one
                remembered output's wording, ``db.output_grams``; it says nothing of the key's colours),
                paraphrase_of_own_output as ``{matched}`` only (one bit: the text restates one remembered
                output in other words at the calibrated threshold, ``detector.paraphrase_match``), promise
                (what the p-value promises and its margin, ``detector.promise``; not whether the margin raised it)
    scored      z_score, p_value (coarse and dithered as above; None for insufficient_text)
    watermarked key_id, decided_by, windows {detected, char_start, char_end}, spoof_suspected (one bit:
                the spoof check's decision, ``detector.spoof_check``; None while it cannot judge)
    negative    spoof_suspected under a two-part key whose published half says watermarked (one bit, from
                the paired test dithered like z; ``detector.two_part``)
    never       num_tokens_scored, num_green_tokens, green_fraction, p_value_normal, keys (per-key z/p),
                num_common_positions, num_forced_positions, calibration details, explanation, spoof_check,
                own_output (the n-gram counts behind matches_own_output), the similarity, false-match rate and
                receipt id of paraphrase_of_own_output (a similarity oracle over other callers' outputs),
                public_half (the published half's counts and the paired test)

The stored verdict row keeps the full numbers (the audit trail loses nothing) and what was shown.
"""

from __future__ import annotations

import hashlib
import hmac
import math

import numpy as np

from detector.row_order import packed_keys, sorted_order
from watermark.public_key import SPOOF_ALPHA
from watermark.specs import is_sampling, parse_spec
from watermark.stats import p_value_normal, z_for_p

STEP_UNITS = 8  # the z grid shown to ``detect`` is 8 green-count units wide: a one-unit change shows 1 time in 8
MAX_Z = 37.5  # z of the smallest positive double's tail; p = 0 is shown as this z
DETECT_SCOPE, EXPLAIN_SCOPE = "detect", "explain"
DISCLOSURE = "coarse-dithered/v1"  # names the rule above in every detect-scope answer
DETECT_FIELDS = ("verdict", "watermark", "fingerprint", "num_tokens", "alpha", "z_threshold", "min_tokens",
                 "dedup", "correction", "normalizations", "tokenizer_fingerprint", "model_id", "text_sha256",
                 "text_length", "common_units", "matches_own_output", "promise")
_DITHER_DOMAIN = b"provmark/detect-dither/v1\x00"
# what every stored verdict records of its detect-scope view (options["disclosed"]; the audit scope alone reads it)
RECORDED_FIELDS = ("disclosure", "verdict", "z_score", "p_value", "key_id", "decided_by", "windows",
                   "spoof_suspected", "matches_own_output", "paraphrase_of_own_output")


def with_spec_fingerprint(verdict: dict) -> dict:
    """``verdict`` (a ``Verdict.to_dict`` or a scope's view of it, changed in place) with ``spec_fingerprint``: the
    scored spec's fingerprint under the name stored verdicts and receipts give it (``fingerprint`` alone is a key's,
    in key listings). The old ``fingerprint`` stays beside it for one release."""
    if "fingerprint" in verdict:
        verdict["spec_fingerprint"] = verdict["fingerprint"]
    return verdict


def recorded(coarse: dict) -> dict:
    """The part of a detect-scope view (``disclose``) a stored verdict records (``RECORDED_FIELDS``)."""
    return {name: coarse.get(name) for name in RECORDED_FIELDS}


def shown_paraphrase(fact: dict | None) -> dict | None:
    """``paraphrase_of_own_output`` as the ``detect`` scope sees it: whether it matched, nothing else (the
    similarity would grade a caller's probes against outputs written for others; the receipt id would name them)."""
    return None if fact is None else {"matched": bool(fact["matched"])}


def dither(dither_key: bytes, fingerprint: str, key_id: str | None, units: np.ndarray) -> float:
    """u in [0, 1): a keyed PRF of the spec, the key and the SET of counted units (order and repeats
    do not re-draw it), so the same scored content always gets the same u."""
    rows = np.ascontiguousarray(units, dtype=np.int64)
    if rows.size:
        rows = rows.reshape(rows.shape[0], -1)
        rows = rows[sorted_order(packed_keys(rows))]  # a lexsort is ~10x faster than np.unique(axis=0)
    return dither_sorted(dither_key, fingerprint, key_id, rows)


def dither_sorted(dither_key: bytes, fingerprint: str, key_id: str | None, rows: np.ndarray) -> float:
    """``dither`` of unit rows [N, k] already in sorted order (repeats allowed), as a caller that sorted
    them for dedup has them."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size:
        rows = rows.reshape(rows.shape[0], -1)
        rows = rows[np.concatenate(([True], (rows[1:] != rows[:-1]).any(axis=1)))]
    mac = hmac.new(dither_key, _DITHER_DOMAIN + f"{fingerprint}|{key_id}|".encode(), hashlib.sha256)
    mac.update(rows.tobytes())
    return int.from_bytes(mac.digest()[:8], "little") / 2.0**64


SAMPLING_UNIT_VARIANCE = 0.25  # sampling specs: d = 1 / sqrt(T / 4) = 2 / sqrt(T) (module docstring)
PAIRED_UNIT_VARIANCE = 0.25  # two-part keys' paired test: b ~ Binomial(b + c, 1/2), one unit moves z by 2 / sqrt(b + c)


def unit_variance(spec) -> float:
    """What one unit's change is measured against in z: gamma (1 - gamma) for kgw/hf, 1/4 for sampling specs
    (``spec``: the value, or its string)."""
    spec = parse_spec(spec)
    return SAMPLING_UNIT_VARIANCE if is_sampling(spec) else spec.gamma * (1.0 - spec.gamma)


def z_step(num_scored: int, gamma: float) -> float:
    """The grid width ``w`` in z for a text of ``num_scored`` counted units (module docstring)."""
    return step_for(num_scored, gamma * (1.0 - gamma))


def step_for(num_scored: int, variance: float) -> float:
    """``z_step`` for a unit variance (``unit_variance``): STEP_UNITS / sqrt(T variance)."""
    return STEP_UNITS / math.sqrt(max(1, num_scored) * variance)


def z_of(p_value: float) -> float:
    """The normal quantile of an exact p-value, finite: |z| <= MAX_Z (p = 0 from underflow is z = MAX_Z)."""
    if p_value <= 0.0:
        return MAX_Z
    return max(-MAX_Z, min(MAX_Z, z_for_p(min(1.0, p_value))))  # p = 1: z = -inf, shown as -MAX_Z


def shown_z(p_value: float, alpha: float, u: float, step: float) -> float:
    """The coarse, dithered z of the module docstring for an exact (corrected) p-value, never above it."""
    z_threshold = z_for_p(alpha)
    return z_threshold + step * math.floor((z_of(p_value) - z_threshold) / step - u)


def disclose(full: dict, scope_allows_explain: bool, u: float | None, variance: float) -> dict:
    """The verdict dict a caller may see: ``full`` itself for ``explain``, else the detect-scope view."""
    if scope_allows_explain:
        return full
    out = {name: full[name] for name in DETECT_FIELDS}
    if out["promise"] is not None:  # whether the margin raised this p-value is a bit of the exact score
        out["promise"] = {name: value for name, value in out["promise"].items() if name != "raised"}
    out["disclosure"] = DISCLOSURE
    out["paraphrase_of_own_output"] = shown_paraphrase(full.get("paraphrase_of_own_output"))
    out.update(z_score=None, p_value=None, key_id=None, decided_by=None, windows=None,
               calibration_id=(full.get("calibration") or {}).get("id"), spoof_suspected=None)
    exact = full["verdict"]
    if exact == "insufficient_text" or u is None:
        return out
    z = shown_z(full["p_value"], full["alpha"], u, step_for(full["num_tokens_scored"], variance))
    window = _shown_window(full.get("windows"), u, variance)
    if z >= z_for_p(full["alpha"]) - 1e-9:
        verdict, decided_by = "watermarked", "text"
    elif window is not None:
        verdict, decided_by = "watermarked", "window"
    else:
        verdict = "insufficient_text" if full["num_tokens_scored"] < full["min_tokens"] else "not_watermarked"
        decided_by = None
    out["verdict"] = verdict
    if verdict == "insufficient_text":
        return out
    # at or below zero a user learns nothing useful (a caller would learn the sign): shown as 0 and p = 1
    out.update(z_score=max(z, 0.0), p_value=p_value_normal(z) if z > 0 else 1.0)
    if verdict == "watermarked":
        out.update(key_id=full["key_id"], decided_by=decided_by,
                   windows={"detected": window is not None, **(window or {})} if full.get("windows") else None,
                   spoof_suspected=(full.get("spoof_check") or {}).get("suspected"))
    else:
        if full.get("windows") is not None:
            out["windows"] = {"detected": False}
        out["spoof_suspected"] = _shown_public_half_spoof(full.get("public_half"), u)
    return out


def _shown_public_half_spoof(report: dict | None, u: float) -> bool | None:
    """A negative verdict under a two-part key: whether its published half was spoofed (``detector.two_part``),
    decided on the paired test's p-value dithered like the verdict (one unit moves it 1 time in STEP_UNITS), so
    the bit is no sharper a view of the private colours than the verdict itself. None when the public half
    does not say watermarked (then there is nothing to have spoofed)."""
    if report is None or report["verdict"] != "watermarked":
        return None
    test = report["spoof_test"]
    pairs = test["public_only"] + test["private_only"]
    z = shown_z(test["p_value"], SPOOF_ALPHA, u, step_for(pairs, PAIRED_UNIT_VARIANCE))
    return bool(z >= z_for_p(SPOOF_ALPHA) - 1e-9)


def _shown_window(windows: dict | None, u: float, variance: float) -> dict | None:
    """The best window's span when its dithered z also clears the window threshold, else None."""
    if not windows or not windows.get("best"):
        return None
    best, alpha = windows["best"], windows["alpha"]
    z = shown_z(best["p_value_corrected"], alpha, u, step_for(best["num_tokens_scored"], variance))
    if z < z_for_p(alpha) - 1e-9:
        return None
    return {"char_start": best["char_start"], "char_end": best["char_end"]}
