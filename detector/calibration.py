"""Per-key calibration: the null distribution of z for ONE key, measured on human text.

A verdict's false-positive rate is a promise about the key in use. ``calibrate``
(detector/calibrate.py, which also screens new keys) scores human text
that ships in installed packages (the fit half of ``detector.human_corpora``, every domain there:
news, encyclopedia, documentation prose, code, licence boilerplate) under one key and one spec, cut
into windows of 64 to 4,096 tokens, exactly as the detector scores (common units left out, n-gram
dedup), and reports per bucket of scored length T: the mean and spread of z, and the realised
false-positive rate at the threshold that such a null implies, next to the stated one.

The result is public (a handful of means and spreads: nothing about single colours) and is kept
with the key's public metadata in ``$PROVMARK_HOME/calibrations.json`` (MACed with a key derived
from the master key, so an edited file is refused rather than trusted). The detector uses it as a
guard that can only make a verdict more careful: where a key's null is measurably shifted up or
wider than N(0, 1) in the verdict's length bucket, the p-value is taken under that null instead
(``guarded_p_value``), and every verdict says which calibration it used.
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import hmac
import json
import logging
import math
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from detector.common_units import uses_table
from detector.key_source import has_master_key
from watermark.key_info import KeyringIntegrityError
from watermark.paths import write_private_atomic
from watermark.specs import parse_spec
from watermark.stats import Z_THRESHOLD, p_value_normal

log = logging.getLogger(__name__)

FORMAT = 1
FILE_NAME = "calibrations.json"
MAC_PURPOSE = b"provmark/calibrations-mac"
BUCKET_EDGES = (1, 25, 50, 100, 200, 400, 800, 1600)  # of scored units T; the last bucket is open
MIN_BUCKET_TEXTS = 30  # fewer texts than this in a bucket: no estimate there (the guard stays off)
GUARD_SIGMAS = 2.0  # the guard acts only on a shift or spread this many standard errors past N(0, 1)
SCREEN_FACTOR = 2.0  # key screening: a key whose estimated realised FPR exceeds this multiple fails
SCREEN_SHIFT = 0.1  # key screening: a bucket's mean z this far off 0 (beyond noise) fails the key
YOURS = "yours"  # the domain of the texts a user calibrated a key on (``detector.calibrate.with_your_texts``)


def bucket_of(total: int) -> int:
    """Index of the scored-length bucket of T (0 for T < 25 ... len(BUCKET_EDGES) - 1 for T >= 1600)."""
    return max(0, bisect.bisect_right(BUCKET_EDGES, total) - 1)  # numpy's searchsorted costs 10x on one value


def bucket_label(index: int) -> str:
    lo = BUCKET_EDGES[index]
    return f"{lo}+" if index == len(BUCKET_EDGES) - 1 else f"{lo}-{BUCKET_EDGES[index + 1] - 1}"


@dataclass(frozen=True, slots=True)
class Bucket:
    index: int
    n: int
    mean: float
    sd: float

    @property
    def guard(self) -> tuple[float, float]:
        """(shift, scale) of the null the guard holds verdicts to: N(0, 1) unless the measured mean is
        above 0, or the spread above 1, by more than GUARD_SIGMAS standard errors."""
        if self.n < MIN_BUCKET_TEXTS:
            return 0.0, 1.0
        se_mean = self.sd / math.sqrt(self.n)
        se_sd = self.sd / math.sqrt(2.0 * (self.n - 1))
        return max(0.0, self.mean - GUARD_SIGMAS * se_mean), max(1.0, self.sd - GUARD_SIGMAS * se_sd)

    def guarded_fpr(self, z_threshold: float) -> float:
        """P(Z >= threshold) under the null the guard holds verdicts to (``guard``)."""
        shift, scale = self.guard
        return p_value_normal((z_threshold - shift) / scale)

    def realised_fpr(self, z_threshold: float) -> float:
        """P(z >= threshold) under N(mean, sd): the false-positive rate this key's null implies."""
        return p_value_normal((z_threshold - self.mean) / max(self.sd, 1e-9))

    def to_dict(self, z_threshold: float = Z_THRESHOLD) -> dict:
        return {"bucket": bucket_label(self.index), "n": self.n, "mean_z": round(self.mean, 4),
                "sd_z": round(self.sd, 4), "realised_fpr": self.realised_fpr(z_threshold) if self.n else None}


@dataclass(frozen=True, slots=True)
class Calibration:
    """One key's measured null under one spec."""

    key_id: str
    key_fingerprint: str
    spec: str
    spec_fingerprint: str
    common_units: str | None
    created_at: str
    buckets: tuple[Bucket, ...]
    domains: dict  # domain -> {"n": texts, "mean_z": .., "sd_z": ..}
    corpus: dict  # domain -> documents used
    z_threshold: float = Z_THRESHOLD
    z_values: tuple = field(default=(), compare=False, repr=False)  # every window's z (for plots; not stored)
    _id: str = field(init=False, default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        # the id hashes the stored form (a JSON dump and SHA-256, ~50 us): once here, not on every verdict
        # that reports it (``verdict_calibration``); ``dataclasses.replace`` makes a new one and hashes again
        body = json.dumps(self.to_dict(with_id=False), sort_keys=True, separators=(",", ":"))
        object.__setattr__(self, "_id", "cal-" + hashlib.sha256(body.encode()).hexdigest()[:12])

    @property
    def calibration_id(self) -> str:
        return self._id

    def bucket(self, total: int) -> Bucket:
        return self.buckets[bucket_of(total)]

    @property
    def stated_fpr(self) -> float:
        return p_value_normal(self.z_threshold)

    def worst_realised_fpr(self) -> float:
        """The largest point estimate over buckets (noisy where a bucket has few texts)."""
        values = [b.realised_fpr(self.z_threshold) for b in self.buckets if b.n >= MIN_BUCKET_TEXTS]
        return max(values) if values else float("nan")

    def worst_guarded_fpr(self) -> float:
        """The largest false-positive rate at the threshold under the null the guard holds verdicts to
        (what the data show beyond noise): the stated rate unless a bucket is measurably off."""
        return max(b.guarded_fpr(self.z_threshold) for b in self.buckets)

    def passes_screen(self) -> bool:
        """No bucket's GUARDED null (what the data shows beyond noise) implies more than SCREEN_FACTOR
        times the stated false-positive rate, and no bucket's or domain's mean z is off 0 by more than
        SCREEN_SHIFT beyond noise in either direction (down costs detection power, up false positives)."""
        measured = [(b.n, b.mean, b.sd) for b in self.buckets]
        measured += [(d["n"], d["mean_z"], d["sd_z"]) for d in self.domains.values()]  # code is not prose
        for n, mean, sd in measured:
            if n >= MIN_BUCKET_TEXTS and abs(mean) - GUARD_SIGMAS * sd / math.sqrt(n) > SCREEN_SHIFT:
                return False
        return self.worst_guarded_fpr() <= SCREEN_FACTOR * self.stated_fpr

    def summary(self) -> dict:
        """What ``keys list`` and verdicts show: id, worst bucket, realised vs stated FPR."""
        measured = [abs(b.mean) for b in self.buckets if b.n >= MIN_BUCKET_TEXTS]
        worst = self.worst_realised_fpr()
        return {"id": self.calibration_id, "spec": self.spec, "created_at": self.created_at,
                "max_abs_mean_z": round(max(measured), 4) if measured else None,
                "stated_fpr": self.stated_fpr, "worst_realised_fpr": worst if math.isfinite(worst) else None,
                "worst_guarded_fpr": self.worst_guarded_fpr(), "passes_screen": self.passes_screen(),
                "common_units": self.common_units} | ({"your_texts": self.corpus[YOURS]} if YOURS in self.corpus else {})

    def to_dict(self, with_id: bool = True) -> dict:
        out = {"key_id": self.key_id, "key_fingerprint": self.key_fingerprint, "spec": self.spec,
               "spec_fingerprint": self.spec_fingerprint, "common_units": self.common_units,
               "created_at": self.created_at, "z_threshold": self.z_threshold,
               "buckets": [[b.index, b.n, b.mean, b.sd] for b in self.buckets],
               "domains": self.domains, "corpus": self.corpus}
        if with_id:
            out["id"] = self.calibration_id
        return out

    @classmethod
    def from_dict(cls, raw: dict) -> Calibration:
        buckets = tuple(Bucket(int(i), int(n), float(m), float(s)) for i, n, m, s in raw["buckets"])
        return cls(raw["key_id"], raw["key_fingerprint"], raw["spec"], raw["spec_fingerprint"], raw["common_units"],
                   raw["created_at"], buckets, raw["domains"], raw["corpus"], float(raw["z_threshold"]))


def guarded_p_value(p_value: float, z: float, total: int, calibration: Calibration | None) -> tuple[float, bool]:
    """The verdict's p-value under this key's measured null: never smaller than ``p_value``; larger
    where the calibration shows the key's null shifted up or widened in this length bucket.
    Returns (p, whether the guard changed it)."""
    if calibration is None or total <= 0 or not math.isfinite(z):
        return p_value, False
    shift, scale = calibration.bucket(total).guard
    if shift == 0.0 and scale == 1.0:
        return p_value, False
    guarded = p_value_normal((z - shift) / scale)
    return (guarded, True) if guarded > p_value else (p_value, False)


def verdict_calibration(calibration: Calibration, total: int, guarded: bool) -> dict:
    """What a verdict reports about the calibration it used: its id, the length bucket (measured on the user's
    own texts, ``keys calibrate --corpus``, or on the shipped corpora), and whether it changed the p-value."""
    bucket = calibration.bucket(total)
    label = bucket_label(bucket.index)
    yours = calibration.domains.get(YOURS, {})
    return {"id": calibration.calibration_id, "created_at": calibration.created_at,
            "bucket": label, "n": bucket.n, "mean_z": round(bucket.mean, 4),
            "sd_z": round(bucket.sd, 4), "measured_on": YOURS if label in yours.get("buckets", ()) else "shipped",
            "guarded": guarded}


def null_record(verdict) -> dict:
    """The part of a stored verdict that says which null it was held to: the common-unit table and
    how many positions it left out, and the key's calibration (both stored verdict writers use it).
    ``verdict``: a ``detector.verdict.Verdict``, or its dict (``to_dict``; the batch rows' JSON)."""
    if not isinstance(verdict, dict):  # read off the verdict: no to_dict (a deep copy) for three fields
        return {"common_units": verdict.common_units, "num_common_positions": verdict.num_common_positions,
                "calibration": verdict.calibration}
    return {"common_units": verdict.get("common_units"), "num_common_positions": verdict.get("num_common_positions", 0),
            "calibration": verdict.get("calibration")}


# ------------------------------------------------------------------------------------- storage
class CalibrationStoreError(KeyringIntegrityError):
    """The calibration file is damaged or was edited (handled like a tampered keyring: fail closed)."""


class CalibrationStore:
    """``home/calibrations.json``: {key_id: {spec_fingerprint: calibration}}, and the records of the deployment's
    own common-unit tables (``detector.your_units``: {tokenizer fingerprint: record}), MACed as a whole."""

    def __init__(self, keyring) -> None:
        self.keyring = keyring
        self.path = Path(keyring.home) / FILE_NAME
        self._file = os.fspath(self.path)
        self._stamp = None
        self._data: dict = {}
        self._your_units: dict = {}  # tokenizer fingerprint -> record of the deployment's own table
        self._parsed: dict = {}  # (key id, spec fingerprint) -> Calibration or None, for the file as read
        self._lock = threading.Lock()

    def _mac(self, body: dict) -> str:
        key = self.keyring.derive_key(MAC_PURPOSE)
        return hmac.new(key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), hashlib.sha256).hexdigest()

    def _read(self) -> dict:
        try:
            st = os.stat(self._file)  # on every verdict: a plain path, pathlib costs more than the stat
        except FileNotFoundError:
            self._stamp, self._data, self._your_units, self._parsed = None, {}, {}, {}
            return self._data
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return self._data
        try:
            doc = json.loads(self.path.read_bytes())
            body, mac = doc["body"], doc["mac"]
        except (ValueError, KeyError, TypeError):
            raise CalibrationStoreError(f"{self.path} is not a provmark calibration file") from None
        if body.get("format") != FORMAT or not hmac.compare_digest(str(mac), self._mac(body)):
            raise CalibrationStoreError(f"{self.path} does not verify (edited, or another master key)")
        self._stamp, self._data, self._your_units, self._parsed = stamp, body["keys"], body.get("your_units", {}), {}
        return self._data

    def refresh(self) -> None:
        """Check the file for a change (one stat): what ``get(..., fresh=False)`` and ``your_units(...,
        fresh=False)`` answer from until the next check. The detector checks once per verdict."""
        with self._lock:
            self._read()

    def get(self, key_id: str, spec_fingerprint: str, fresh: bool = True) -> Calibration | None:
        """The calibration of ``key_id`` under ``spec_fingerprint``, or None: the file is checked for a change
        (one stat; ``fresh=False``: as of the last ``refresh``) and each calibration parsed once per version."""
        with self._lock:
            data = self._read() if fresh else self._data
            found = self._parsed.get((key_id, spec_fingerprint), self)  # self: not parsed yet
            if found is self:
                raw = data.get(key_id, {}).get(spec_fingerprint)
                found = self._parsed[(key_id, spec_fingerprint)] = Calibration.from_dict(raw) if raw else None
        return found

    def your_units(self, tokenizer_fingerprint: str, fresh: bool = True) -> dict | None:
        """The record of the deployment's own common-unit table for this tokenizer (``detector.your_units``), or
        None; ``fresh=False``: as of the last ``refresh``."""
        with self._lock:
            if fresh:
                self._read()
            return self._your_units.get(tokenizer_fingerprint)

    def all_your_units(self) -> dict:
        with self._lock:
            self._read()
            return dict(self._your_units)

    def put_your_units(self, tokenizer_fingerprint: str, record: dict | None) -> dict | None:
        """Set (``record``) or remove (None) the record of this tokenizer's own table; the previous record."""
        with self._lock, _exclusive(self.path.with_suffix(".lock")):
            self._stamp = None
            keys = self._read()
            tables = dict(self._your_units)
            previous = tables.pop(tokenizer_fingerprint, None)
            if record is not None:
                tables[tokenizer_fingerprint] = record
            self._write(keys, tables)
            return previous

    def for_key(self, key_id: str) -> list[Calibration]:
        with self._lock:
            return [Calibration.from_dict(raw) for raw in self._read().get(key_id, {}).values()]

    def put(self, calibration: Calibration) -> None:
        """Add or replace one calibration; concurrent writers (two `keys calibrate`) are serialised by an
        exclusive lock on ``calibrations.lock``, from read to atomic rename, so none is lost."""
        with self._lock, _exclusive(self.path.with_suffix(".lock")):
            self._stamp = None  # re-read under the lock: another process may have written since
            keys = {k: dict(v) for k, v in self._read().items()}
            keys.setdefault(calibration.key_id, {})[calibration.spec_fingerprint] = calibration.to_dict()
            self._write(keys, self._your_units)

    def _write(self, keys: dict, your_units: dict) -> None:
        body = {"format": FORMAT, "keys": keys} | ({"your_units": your_units} if your_units else {})
        write_private_atomic(self.path, json.dumps({"body": body, "mac": self._mac(body)}, indent=1).encode())
        self._stamp = None


@contextmanager
def _exclusive(path: Path):
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def spec_for(text):
    """The spec a calibration is asked for (any family, ``watermark.specs.parse_spec``; None: the default)."""
    return parse_spec(text)


def is_stale(calibration: Calibration, current_digests: set[str]) -> bool:
    """True when the detector would not use ``calibration``: it was measured under a common-unit table that
    is not the current one (``detector.common_units.current_digests``), or with one where the spec's kind
    uses none (the detector compares the digests, scoring_request.current_calibrations)."""
    if not uses_table(parse_spec(calibration.spec)):
        return calibration.common_units is not None
    return calibration.common_units not in current_digests


class ShippedCalibrations:
    """Calibrations carried to batch workers: ``{"key_id|spec fingerprint": calibration dict}``."""

    def __init__(self, shipped: dict) -> None:
        self._parsed = {name: Calibration.from_dict(raw) for name, raw in shipped.items() if raw}

    def get(self, key_id: str, spec_fingerprint: str, fresh: bool = True) -> Calibration | None:
        return self._parsed.get(f"{key_id}|{spec_fingerprint}")


def shipped_calibrations(keyring, key_ids) -> dict:
    """Every calibration of ``key_ids`` in ``keyring``'s home, in the form ShippedCalibrations reads."""
    if not has_master_key(keyring):
        return {}
    store = CalibrationStore(keyring)
    return {f"{c.key_id}|{c.spec_fingerprint}": c.to_dict() for k in key_ids for c in store.for_key(k)}
