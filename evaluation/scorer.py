"""Scoring for the evaluation: the detector's verdicts (``Detector.detect``, default options), the
detection of every prefix, and null scores under keys that wrote nothing.

Null keys live in a throw-away keyring in a temporary folder (their own random master key), deleted
by ``close()``; for a public hf spec the null "keys" are other hashing keys.

``detect_backend``: ``inline`` (default) scores in this process, text by text; ``local`` and ``ray``
send each list of texts through ``detector.batch`` (every local core, or Ray Data on the cluster at
``ray_address``): the same verdicts, computed elsewhere. Prefix curves are always computed here.

Sampling specs (gumbel:, synthid:, ...) go through the same detector (their z is the normal quantile
of the exact p-value); their null keys are fresh random secrets scored with ``detector.scoring_sampling``
directly (the same tests, normalisation, tokenization and common-unit table).

Every score here (verdicts, prefix curves, null keys) leaves out the units the deployment's detector leaves out:
the shipped table merged with the table of the deployment's own texts where it has one (``detector.your_units``),
so tokens to detect and the null are those of the verdicts the deployment gives.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from detector import batch, batch_ray, scoring_sampling
from detector.disclosure import z_of
from detector.normalize import normalize as normalize_text
from detector.promise import prefix_margins
from detector.scoring import Decision
from detector.scoring_request import DetectOptions
from detector.service import Detector
from detector.tokenizing import tokenize
from evaluation.prefix import prefix_p_values
from watermark.keys import Keyring
from watermark.scheme import make_watermark
from watermark.specs import AnySpec, is_sampling

DETECT_BACKENDS = ("inline", "local", "ray")


class Scorer:
    def __init__(self, vocab, keyring, null_keys: int, seed: int, detect_backend: str = "inline",
                 workers: int | None = None, ray_address: str | None = None) -> None:
        if detect_backend not in DETECT_BACKENDS:
            raise ValueError(f"detect_backend: expected one of {', '.join(DETECT_BACKENDS)}, got {detect_backend!r}")
        self.detect_backend = detect_backend
        self.workers = workers
        self.ray_address = ray_address
        self._ray_started = False
        self.vocab = vocab
        # trusted and holding the secrets: it scores one key under every scheme it measures
        self.detector = Detector(vocab=vocab, keyring=keyring, bind_keys=False)
        self.num_null_keys = null_keys
        self.seed = seed
        self._null_home: Path | None = None
        self._null_detector: Detector | None = None
        self._null_ids: list[str] = []
        self.last_alpha: dict[str, float] = {}  # spec -> the alpha its verdicts were held to
        self.last_detected: list[bool] = []

    def __repr__(self) -> str:
        return f"Scorer(null_keys={self.num_null_keys})"

    def score(self, texts: list[str], spec: AnySpec, key_id: str | None, prefixes: bool = False,
              normalize: bool = True) -> list[dict]:
        """Per text: {"z", "detected", "p_value"} and, with ``prefixes``, "prefix": the Bool [T + 1]
        detection of every prefix and "prefix_p": its exact p-values (``evaluation.prefix``)."""
        keys = [key_id] if spec.needs_key else None
        mark = self.detector.watermarks(spec, keys)[0] if prefixes else None
        verdicts = self._verdicts(self.detector, texts, spec, keys, normalize)
        out = []
        for text, verdict in zip(texts, verdicts):
            self.last_alpha[spec.format()] = verdict["alpha"]
            row = {"z": verdict["z"], "detected": verdict["watermarked"], "p_value": verdict["p_value"]}
            if prefixes:
                ids, _ = tokenize(self.vocab, normalize_text(text, normalize).text, with_offsets=False)
                row["prefix_p"] = prefix_p_values(mark, ids, common=self.detector.common_units_for(spec),
                                                  margins=self._prefix_margins(mark, ids))
                row["prefix"] = row["prefix_p"] <= verdict["alpha"]
            out.append(row)
        self.last_detected = [r["detected"] for r in out]
        return out

    def _prefix_margins(self, mark, ids):
        """Each prefix's margin under the key's promise, as its verdict would carry it (``detector.promise``); None for
        the specs without one (public hf specs, sampling specs)."""
        if is_sampling(mark.spec) or mark.key_id is None:
            return None
        calibration = self.detector.calibrations_for([mark])[0]
        common = self.detector.common_units_for(mark.spec)
        if calibration is not None and calibration.common_units != (common.digest if common is not None else None):
            calibration = None  # measured under another table: the verdict holds the key uncalibrated too
        return prefix_margins(self.vocab, np.asarray(ids, dtype=np.int64), mark.spec.scheme, calibration)

    def z_scores(self, texts: list[str], spec: AnySpec, key_id: str | None, normalize: bool = True) -> list:
        return [r["z"] for r in self.score(texts, spec, key_id, normalize=normalize)]

    def null_z_scores(self, texts: list[str], spec: AnySpec) -> list:
        """z of every text under each null key (texts x keys values)."""
        if self.num_null_keys == 0:
            return []
        out = []
        if is_sampling(spec):  # fresh secrets, one per null key, from the run's seed (hf:synthid: other keys)
            rng = random.Random(self.seed)
            for _ in range(self.num_null_keys):
                mark = self._sampling_mark(spec, None, rng)
                out += [self._sampling_verdict(mark, t, True)["z"] for t in texts]
            return out
        if not spec.needs_key:
            rng = random.Random(self.seed)
            for _ in range(self.num_null_keys):
                other = spec.with_(hashing_key=rng.randrange(1, 2**31))
                out += [v["z"] for v in self._verdicts(self.detector, texts, other, None, True)]
            return out
        detector = self._nulls()
        for key in self._null_ids:
            out += [v["z"] for v in self._verdicts(detector, texts, spec, [key], True)]
        return out

    def _sampling_mark(self, spec: AnySpec, key_id: str | None, null_rng: random.Random):
        """A null key's sampling watermark: a fresh secret (hf:synthid: other public keys)."""
        if spec.needs_key:
            return make_watermark(spec, null_rng.randbytes(32), self.vocab.vocab_size, "null")
        keys = tuple(null_rng.randrange(1, 2**31) for _ in spec.keys)  # hf:synthid: other public keys
        return make_watermark(replace(spec, keys=keys), None, self.vocab.vocab_size)

    def _sampling_verdict(self, mark, text: str, normalize: bool) -> dict:
        """The detector's whole-text test for a sampling watermark: exact p <= alpha = P(Z >= 4)."""
        ids, _ = tokenize(self.vocab, normalize_text(text, normalize).text, with_offsets=False)
        score = scoring_sampling.score_text(mark, ids, common=self.detector.common_units_for(mark.spec))
        alpha = Decision.make().alpha
        return {"z": z_of(score.p_value), "watermarked": score.p_value <= alpha, "p_value": score.p_value,
                "alpha": alpha}

    def _verdicts(self, detector: Detector, texts: list[str], spec: AnySpec, keys, normalize: bool) -> list[dict]:
        """Per text {"z", "watermarked", "p_value", "alpha"} from the chosen detection back end."""
        if self.detect_backend == "inline":
            verdicts = (detector.detect(t, keys=keys, spec=spec, options=DetectOptions(normalize=normalize)) for t in texts)
            return [{"z": v.z_score, "watermarked": v.watermarked, "p_value": v.p_value, "alpha": v.alpha}
                    for v in verdicts]
        prepared = batch.prepare_jobs([{"text": t} for t in texts], batch.DetectOptions(normalize=normalize),
                                      keys=keys, spec=spec, vocab=self.vocab, keyring=detector.keyring,
                                      bind_keys=False)
        if detector is not self.detector:  # a null key's throw-away keyring has no table of the deployment's texts
            prepared.your_units = self.detector.your_units()
        if self.detect_backend == "ray":
            self._ray_started = batch_ray.connect_ray(self.ray_address) or self._ray_started
            found = batch_ray.run_ray(prepared, workers=self.workers)
        else:
            found = batch.run_local(prepared, workers=self.workers)
        nan = float("nan")  # to_dict() wrote NaN (nothing scored) as None
        return [{"z": nan if v["z_score"] is None else v["z_score"], "watermarked": v["verdict"] == "watermarked",
                 "p_value": v["p_value"], "alpha": v["alpha"]} for v in found]

    def _nulls(self) -> Detector:
        if self._null_detector is None:
            self._null_home = Path(tempfile.mkdtemp(prefix="provmark-null-keys-"))
            ring = Keyring(home=self._null_home, master_key=os.urandom(32))
            self._null_ids = [ring.create().key_id for _ in range(self.num_null_keys)]
            # one null key, every scheme, scored with the deployment's table (its own texts' units too)
            self._null_detector = Detector(vocab=self.vocab, keyring=ring, bind_keys=False,
                                           your_units=self.detector.your_units())
        return self._null_detector

    def close(self) -> None:
        if self._ray_started:
            import ray  # noqa: PLC0415 (Ray, heavy and optional: loads for a Ray run only)

            ray.shutdown()
            self._ray_started = False
        if self._null_home is not None:
            shutil.rmtree(self._null_home, ignore_errors=True)
            self._null_home = None
            self._null_detector = None
