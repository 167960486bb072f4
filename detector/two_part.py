"""The public half of a two-part key on a verdict (``watermark.public_key``): what a verifier holding the
published half concludes, and whether the private half says that conclusion was spoofed.

The private half decides the verdict. For every tested key that has a public half, the text is also scored
under the public half exactly as a public verifier scores it (same normalisation, tokens, common units,
dedup, forced positions, alpha), and McNemar's exact test compares the two halves on the positions counted
under both. ``spoof_suspected``: the public half says watermarked, the private half does not, and the test
rejects at ``SPOOF_ALPHA``: green under the published list only, as text steered by that list is (None when
the public half says otherwise, or ours says watermarked).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detector.calibration import CalibrationStore
from detector.scoring import WATERMARKED, counted_positions, score_counts, score_positions, verdict_of
from watermark.key_binding import bound_spec
from watermark.public_key import SPOOF_ALPHA, PublicKey, public_half_id, spoof_test


@dataclass(frozen=True, slots=True)
class PrivateScoring:
    """How the text was scored under the private halves: its ids, the common-unit table and dedup the
    published half is scored with, the forced positions, and each mark's private-half flags and counted mask."""

    ids: object
    common: object
    dedup: bool
    forced: np.ndarray
    flags: list
    counted: list


def public_half_report(marks, private: PrivateScoring, alpha: float, min_tokens: int, verdict: str) -> dict | None:
    """The report of the tested two-part key whose public half is most significant; None when no tested
    key has a public half."""
    ids, common, dedup, forced = private.ids, private.common, private.dedup, private.forced
    best = None
    for mark, private_flags, private_counted in zip(marks, private.flags, private.counted):
        if not getattr(mark, "has_public_half", False):
            continue
        public = mark.public_mark()
        public_flags, prev = score_positions(public, ids, common, dedup)
        if forced.shape[0]:
            prev[forced] = forced
        public_counted = counted_positions(prev, True)
        score = score_counts(mark.key_id, int(np.count_nonzero(public_flags & public_counted)),
                             int(np.count_nonzero(public_counted)), mark.spec.gamma)
        test = spoof_test(public_flags, private_flags, public_counted & private_counted)
        public_verdict = verdict_of(score.p_value, score.num_tokens_scored, alpha, min_tokens)
        # None where there is nothing to have spoofed (the published half does not say watermarked) or nothing
        # to catch (our own verdict says watermarked: the own-output check speaks there)
        suspected = (test["p_value"] <= SPOOF_ALPHA if public_verdict == WATERMARKED and verdict != WATERMARKED
                     else None)
        report = {**score.to_dict(), "verdict": public_verdict, "fingerprint": mark.public_fingerprint,
                  "spoof_test": test, "spoof_suspected": suspected}
        del report["p_value_corrected"]  # one published key, tested alone
        if best is None or (score.p_value, -(score.z_score or 0.0)) < (best["p_value"], -(best["z_score"] or 0.0)):
            best = report
    return best


def published_document(keyring, info, vocab) -> PublicKey:
    """The document a two-part key publishes (``watermark.public_key.PublicKey``) with its published half's
    calibration under the key's spec, when one was measured; KeyStateError for a one-part key."""
    spec = bound_spec(info)
    half = keyring.public_half(info.key_id)
    found = CalibrationStore(keyring).get(public_half_id(info.key_id), spec.fingerprint(vocab.vocab_size))
    return PublicKey.make(info.key_id, spec.format(), half, vocab, calibration=found.to_dict() if found else None)
