"""Measuring a key's null on human text (``calibrate`` -> ``Calibration``, see detector/calibration.py for
what it is and how verdicts use it) and screening new keys by it: ``screened_secret`` draws secrets until
one's null passes, ``ensure_screened_active_key`` gives a keyring with no key a first, screened one."""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import torch
from tqdm import tqdm

from detector import common_units, human_corpora
from detector.calibration import (
    BUCKET_EDGES,
    MIN_BUCKET_TEXTS,
    YOURS,
    Bucket,
    Calibration,
    CalibrationStore,
    bucket_label,
    bucket_of,
)
from detector.common_units import FIT_DOMAINS, CommonUnits
from detector.disclosure import z_of
from detector.normalize import normalize as normalize_text
from detector.promise import kinds_of
from detector.scoring import score_positions
from detector.scoring_sampling import counted_score, positions
from detector.tokenizing import tokenize
from detector.your_units import YourUnits, scoring_table
from watermark.config import WatermarkSpec
from watermark.key_info import KeyNotFoundError, key_fingerprint, new_secret
from watermark.public_key import public_half_secret
from watermark.scheme import make_watermark
from watermark.specs import AnySpec, is_sampling
from watermark.stats import Z_THRESHOLD, z_score

log = logging.getLogger(__name__)

WINDOW_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096)  # tokens of the human windows scored
WINDOWS_PER_LENGTH = 120  # per domain and length, at most ...
TOKENS_PER_LENGTH = 150_000  # ... and at most this many tokens per domain and length
SCREEN_TRIES = 8  # fresh secrets drawn at most, per key created (about 1 in 4 random keys fails)


class HumanWindows:
    """The fit half of the human corpora, tokenized once per tokenizer and cut into windows."""

    _cache: dict[str, HumanWindows] = {}
    _lock = threading.Lock()

    def __init__(self, vocab) -> None:
        docs = human_corpora.documents(FIT_DOMAINS, human_corpora.FIT)
        if not docs:
            raise RuntimeError("no human corpus is installed to calibrate on (pip install gensim)")
        encoded = vocab.tokenizer.backend_tokenizer.encode_batch_fast([d.text for d in docs], add_special_tokens=False)
        self.corpus: dict[str, int] = {}
        self.windows: list[tuple[str, torch.Tensor]] = []
        by_domain: dict[str, list[np.ndarray]] = {}
        for doc, enc in zip(docs, encoded):
            by_domain.setdefault(doc.domain, []).append(np.asarray(enc.ids, dtype=np.int64))
            self.corpus[doc.domain] = self.corpus.get(doc.domain, 0) + 1
        seen: set[bytes] = set()
        for domain, streams in by_domain.items():
            for length in WINDOW_LENGTHS:
                cut = [s[i:i + length] for s in streams for i in range(0, s.shape[0] - length + 1, length)]
                cut = [w for w in cut if not (w.tobytes() in seen or seen.add(w.tobytes()))]  # a licence
                # shipped by twenty packages is one text, not twenty
                limit = min(WINDOWS_PER_LENGTH, max(1, TOKENS_PER_LENGTH // length))
                if len(cut) > limit:  # an even spread over the corpus, the same on every machine
                    cut = [cut[int(j)] for j in np.linspace(0, len(cut) - 1, limit)]
                self.windows.extend((domain, torch.from_numpy(w)) for w in cut)

    @classmethod
    def for_vocabulary(cls, vocab) -> HumanWindows:
        with cls._lock:
            found = cls._cache.get(vocab.fingerprint)
            if found is None:
                found = cls._cache[vocab.fingerprint] = cls(vocab)
            return found


def window_z(watermark, ids: torch.Tensor, common: CommonUnits | None) -> tuple[int, float]:
    """(T, z) of one human window as the detector scores it: kgw z from the green count; for sampling
    specs the normal quantile of the exact p-value (detector.sampling_verdict), which the guard compares."""
    if is_sampling(watermark.spec):
        values, prev = positions(watermark, ids, True, common)
        score = counted_score(watermark, values, prev)
        return score.num_tokens_scored, z_of(score.p_value) if score.num_tokens_scored else 0.0
    flags, prev = score_positions(watermark, ids, common)
    counted = prev < 0
    total = int(counted.sum())
    return total, z_score(int((flags & counted).sum()), total, watermark.gamma) if total else 0.0


def calibrate(watermark, key_fingerprint: str, vocab, common: CommonUnits | None,
              z_threshold: float = Z_THRESHOLD, progress: bool = False) -> Calibration:
    """Score every human window under ``watermark`` (one key, one spec, kgw or sampling) as the detector would;
    ``common``: the table the detector uses for this spec (None for hf:synthid and vllm:gumbel)."""
    windows = HumanWindows.for_vocabulary(vocab)
    per_bucket, per_domain = _measure(watermark, windows.windows, common, progress, f"calibrating {watermark.key_id}")
    buckets = tuple(_bucket(i, per_bucket.get(i, [])) for i in range(len(BUCKET_EDGES)))
    domains = {d: _domain_stats(v) for d, v in sorted(per_domain.items()) if len(v) > 1}
    spec = watermark.spec
    return Calibration(watermark.key_id or "", key_fingerprint, spec.format(), watermark.fingerprint,
                       common.digest if common is not None else None,
                       datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), buckets, domains,
                       dict(sorted(windows.corpus.items())), float(z_threshold),
                       tuple(z for values in per_bucket.values() for z in values))


def with_your_texts(base: Calibration, watermark, token_ids: list[list[int]], common: CommonUnits | None,
                    progress: bool = False, kinds: list[str] | None = None) -> Calibration:
    """``base`` (``calibrate``'s, on the shipped corpora) together with the key's null on the human text its user
    detects (``provmark keys calibrate --corpus``): the shipped corpora cannot know the units one code base or
    one publication shares (docs/detection.md), the user's own texts do. ``token_ids``: each text normalised
    and tokenized as the detector does (``token_ids_of``), scored whole as a pasted text is. Per length bucket
    the calibration keeps the more careful null of the two (``more_careful``), so adding texts never makes a
    verdict less careful; ``domains["yours"]`` holds the texts' own mean and spread (the key screen reads it
    too) and the labels of the buckets they decided, ``corpus["yours"]`` how many texts were scored. ``kinds``: each
    text's kind (``detector.promise.kinds_of``): ``domains["yours"]["kinds"]`` then holds each kind's mean and spread,
    and verdicts on text of a kind measured here carry the ``measured`` promise (``detector.promise``).
    ValueError when no text has a scored position under this spec."""
    kinds = kinds if kinds is not None else [None] * len(token_ids)
    items = [(kind, torch.tensor(ids, dtype=torch.int64)) for ids, kind in zip(token_ids, kinds)]
    per_bucket, per_kind = _measure(watermark, items, common, progress, f"your texts, {watermark.key_id}")
    values = [z for found in per_bucket.values() for z in found]
    if not values:
        raise ValueError("none of the texts has a scored position under this spec (too short, or empty)")
    yours = tuple(_bucket(i, per_bucket.get(i, [])) for i in range(len(BUCKET_EDGES)))
    buckets = tuple(more_careful(b, y, base.z_threshold) for b, y in zip(base.buckets, yours))
    decided = [bucket_label(b.index) for b, y in zip(buckets, yours) if b is y]
    stats = _domain_stats(values) if len(values) > 1 else {"n": 1, "mean_z": round(values[0], 4), "sd_z": 1.0}
    by_kind = {kind: _domain_stats(found) for kind, found in sorted((k, v) for k, v in per_kind.items() if k)
               if len(found) > 1}
    stats |= {"buckets": decided} | ({"kinds": by_kind} if by_kind else {})
    return replace(base, buckets=buckets, domains={**base.domains, YOURS: stats},
                   corpus={**base.corpus, YOURS: len(values)}, z_values=base.z_values + tuple(values))


def more_careful(shipped: Bucket, yours: Bucket, z_threshold: float) -> Bucket:
    """The bucket whose guarded null (``Bucket.guard``: what its data show beyond noise) implies the larger
    false-positive rate at the threshold; the user's where it has enough texts (MIN_BUCKET_TEXTS) and is
    at least as careful."""
    if yours.n >= MIN_BUCKET_TEXTS and yours.guarded_fpr(z_threshold) >= shipped.guarded_fpr(z_threshold):
        return yours
    return shipped


def token_ids_of(vocab, texts: list[str]) -> list[list[int]]:
    """Each text's token ids as the detector gets them: normalised (the detector's default), tokenized."""
    return [tokenize(vocab, normalize_text(text, True).text, with_offsets=False)[0] for text in texts]


def _measure(watermark, items, common: CommonUnits | None, progress: bool, label: str) -> tuple[dict, dict]:
    """z of every (domain, token ids) item with a scored position: ({bucket: [z]}, {domain: [z]})."""
    per_bucket: dict[int, list[float]] = {}
    per_domain: dict[str, list[float]] = {}
    if progress:
        items = tqdm(items, desc=label, unit="text")
    for domain, ids in items:
        total, z = window_z(watermark, ids, common)
        if total == 0:
            continue
        per_bucket.setdefault(bucket_of(total), []).append(z)
        per_domain.setdefault(domain, []).append(z)
    return per_bucket, per_domain


def _domain_stats(values: list[float]) -> dict:
    return {"n": len(values), "mean_z": round(float(np.mean(values)), 4), "sd_z": round(float(np.std(values, ddof=1)), 4)}


def screened_secret(spec: AnySpec, vocab, common: CommonUnits | None, tries: int = SCREEN_TRIES,
                    progress: bool = False, two_part: bool = False,
                    your_ids: list[list[int]] | None = None) -> tuple[bytes, Calibration, int]:
    """Key screening: draw fresh secrets until one's measured null passes ``passes_screen`` (at most
    ``tries``; else the one whose worst bucket is least bad). Returns (secret, its calibration, draws).
    ``two_part``: the published half (``watermark.public_key``) is a key anyone tests with, so its null
    must pass too; the worse of the two halves ranks a candidate. ``your_ids``: the user's own texts
    (``token_ids_of``; ``keys create --corpus``), which each candidate is measured on as well
    (``with_your_texts``): a key shifted on the collection it will judge is drawn again."""
    best = None
    kinds = None if your_ids is None else kinds_of(vocab, your_ids)
    for attempt in range(1, tries + 1):
        secret = new_secret()
        mark = make_watermark(spec, secret, vocab.vocab_size, key_id="candidate")
        result = calibrate(mark, key_fingerprint(secret), vocab, common, progress=progress)
        if your_ids is not None:
            result = with_your_texts(result, mark, your_ids, common, progress=progress, kinds=kinds)
        halves = [result] + ([public_half_calibration(spec, secret, vocab, common)] if two_part else [])
        if all(half.passes_screen() for half in halves):
            return secret, result, attempt
        worst = max(half.worst_guarded_fpr() for half in halves)
        if best is None or worst < best[2]:
            best = (secret, result, worst)
    return best[0], best[1], tries


def public_half_calibration(spec: AnySpec, secret: bytes, vocab, common: CommonUnits | None) -> Calibration:
    """The measured null of a two-part key's published half (the key whose private half is ``secret``)."""
    half = public_half_secret(secret)
    mark = make_watermark(spec, half, vocab.vocab_size, key_id="public")
    return calibrate(mark, key_fingerprint(half), vocab, common)


def ensure_screened_active_key(keyring, vocab, progress: bool = False):
    """The keyring's active key; when there is none, a first one that passed key screening, with its
    calibration under the default spec stored. Returns (KeyInfo, calibration summary or None)."""
    try:
        return keyring.active(), None
    except KeyNotFoundError:
        pass
    try:
        # the table the detector will score with: the deployment's own texts' units too, where it has them
        common = scoring_table(common_units.for_vocabulary(vocab), YourUnits(keyring).table(vocab.fingerprint))
        secret, result, draws = screened_secret(WatermarkSpec.default(), vocab, common, progress=progress)
    except RuntimeError as exc:  # no human corpus installed: a key all the same, said loudly
        log.warning("watermark key created without screening or calibration (%s)", exc)
        return keyring.ensure_active(), None
    info = keyring.ensure_active(secret)
    if info.fingerprint != key_fingerprint(secret):  # another process made the first key meanwhile
        return info, None
    CalibrationStore(keyring).put(for_key(result, info.key_id))
    return info, {**result.summary(), "screening_draws": draws}


def for_key(calibration: Calibration, key_id: str) -> Calibration:
    """The calibration of a screened candidate, named after the key it became."""
    return replace(calibration, key_id=key_id)


def _bucket(index: int, values: list[float]) -> Bucket:
    if len(values) < 2:
        return Bucket(index, len(values), 0.0, 1.0)
    arr = np.asarray(values, dtype=np.float64)
    return Bucket(index, int(arr.size), float(arr.mean()), float(arr.std(ddof=1)))
