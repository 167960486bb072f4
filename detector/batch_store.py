"""Storing a batch's verdicts (``provmark detect-batch --store``): every verdict of ``detector.batch``'s jobs
and its ``detection`` audit event in one transaction, through the one verdict writer (``db.verdicts``), in the
form POST /v1/detect stores."""

from __future__ import annotations

from collections.abc import Sequence

from db.caller import Caller
from db.verdicts import VerdictRecord, record_verdicts
from detector.batch import DetectJob, DetectOptions, PreparedJobs
from detector.calibration import null_record

STORE_CALLER = "cli:detect-batch"  # the audit actor of batch verdicts


def store_verdicts(store, prepared: PreparedJobs, verdicts: Sequence[dict], caller=None) -> list[str]:
    """Write every verdict and its ``detection`` audit event in ONE transaction (all or nothing), through
    the one verdict writer (db.verdicts.record_verdicts); returns the verdict ids in order. Texts are kept
    only when the store retains text."""
    if len(verdicts) != len(prepared.jobs):
        raise ValueError("verdicts: expected one per job")
    views = prepared.disclosed if len(prepared.disclosed) == len(verdicts) else [None] * len(verdicts)
    records = [_verdict_record(job, verdict, prepared.options, view)
               for job, verdict, view in zip(prepared.jobs, verdicts, views)]
    return record_verdicts(store, records, caller or Caller(name=STORE_CALLER), [job.text for job in prepared.jobs])


def _verdict_record(job: DetectJob, verdict: dict, options: DetectOptions, disclosed: dict | None) -> VerdictRecord:
    """The stored form, as POST /v1/detect stores it: no per-token explanation; NaN z -> 0; with its detect-scope
    view when the run recorded one."""
    stored_options = {"watermark": job.spec, "keys": list(job.keys) if job.keys else None,
                      "windows": options.windows, "normalize": options.normalize, "dedup": options.dedup,
                      "z_threshold": options.z_threshold, "fpr": options.fpr,
                      "forced_positions": list(job.forced_positions) or None,
                      "keys_tested": [k["key_id"] for k in verdict["keys"] if k.get("key_id")], "source": "batch",
                      "null": null_record(verdict)}
    if verdict.get("statistic") is not None:  # sampling specs: the scheme's own statistic (no green count)
        stored_options["statistic"] = verdict["statistic"]
    if verdict.get("public_half") is not None:  # two-part keys: the published half's verdict and the paired test
        stored_options["public_half"] = verdict["public_half"]
    if disclosed is not None:
        stored_options["disclosed"] = disclosed
    p_value = verdict["p_value"]
    return VerdictRecord(
        text_sha256=verdict["text_sha256"], verdict=verdict["verdict"], z=verdict["z_score"] or 0.0,
        p_value=min(1.0, max(0.0, 1.0 if p_value is None else p_value)),
        green_count=int(verdict["num_green_tokens"] or 0), scored_count=int(verdict["num_tokens_scored"]),
        green_fraction=verdict["green_fraction"] or 0.0, spec=verdict["watermark"],
        spec_fingerprint=verdict["fingerprint"], tokenizer_fingerprint=verdict["tokenizer_fingerprint"],
        key_id=verdict["key_id"], options=stored_options, windows=verdict["windows"])
