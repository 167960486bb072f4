"""Batch detection: many texts scored on every local core or on a Ray cluster, verdicts in input order.

    jobs = prepare_jobs(records, options, vocab=vocab, keyring=keyring)   # validates, resolves keys
    verdicts = run_local(jobs, workers=4)            # or batch_ray.run_ray(jobs, address="auto")
    batch_store.store_verdicts(store, jobs, verdicts)  # optional: one transaction for the whole batch

Each verdict is exactly ``Detector.detect(text, ...).to_dict()`` for that record (``provmark detect``
runs the same function): the records are cut into chunks of ``CHUNK_ROWS`` and every worker holds a
``Detector`` built over the SAME tokenizer and the SAME key secrets as the caller's.

What travels to the workers, and how (key material is never written anywhere in the clear):
  - the master key and the keyring file never leave the driver. The driver opens the keyring and
    takes out only the 32-byte PRF secrets of the keys under test (``KeySecrets``); retired keys and
    keys nobody asked for stay behind. The detect-scope dither's key (derived from the master key,
    ``detector.service.dither_key_of``) travels with them, so a stored row records the same detect-scope
    view the service would show for that text (``PreparedJobs.disclosed``; the audit scope alone reads it).
  - local workers (``run_local``) are spawned processes; the secrets and the tokenizer reach them
    pickled through the pool's pipe, in memory.
  - Ray workers (``detector.batch_ray.run_ray``, Ray Data ``map_batches`` over an actor pool): Ray Data ``ray.put``s the
    actors' constructor arguments into the object store, which may spill objects to disk under
    memory pressure. So the secrets travel there only SEALED: AES-256-GCM under a fresh random
    per-job transport key (``detector.batch_secrets.seal_secrets``). The transport key travels apart, as the env var
    ``PROVMARK_BATCH_TRANSPORT_KEY`` of the actors' ``runtime_env`` (held in the GCS's memory and the
    actor process's environment, never in the object store); each actor reads it and removes it from
    its environment. The tokenizer (public) goes through the object store as is. Caveat: whoever can
    reach the cluster's dashboard / state API can read actors' runtime_env, as they could read worker
    memory or submit jobs: cluster access is the trust boundary. Between machines Ray speaks gRPC:
    turn on Ray's TLS (``RAY_USE_TLS=1`` with ``RAY_TLS_SERVER_CERT`` / ``RAY_TLS_SERVER_KEY`` /
    ``RAY_TLS_CA_CERT``) when the cluster spans hosts on an untrusted network.
  - workers keep the secrets in memory only (``Detector`` with ``SecretsKeyring``) and never log them.
Ray workers import provmark: install the same version on every node (or ship it with a runtime_env).

Errors: a record the detector rejects (a lone surrogate, forced positions out of range...) stops the
job with ``BatchError`` naming the record's number, and nothing is written (the store is written
only after every verdict exists, in one transaction).
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from detector.batch_secrets import DITHER_ID, KeySecrets, SecretsKeyring
from detector.calibration import ShippedCalibrations, shipped_calibrations
from detector.disclosure import recorded, with_spec_fingerprint
from detector.key_source import has_master_key
from detector.scoring_request import DetectOptions
from detector.service import Detector, dither_key_of
from detector.your_units import YourUnits
from watermark.config import SpecError
from watermark.key_binding import keys_bound_to, require_bound, shared_spec
from watermark.key_info import KeyringError
from watermark.keys import Keyring
from watermark.public_key import public_half_id
from watermark.specs import AnySpec, parse_spec

CHUNK_ROWS = 256  # rows per task: big enough to hide pickling and scheduling, small enough for a smooth bar


class BatchError(Exception):
    """A batch that cannot run (bad record, unknown key, failed worker). Messages carry no secret."""


@dataclass(slots=True)
class DetectJob:
    """One record ready to score: its text and the spec, keys and forced positions it is scored with."""

    text: str
    spec: str  # canonical spec string
    keys: tuple[str, ...] | None  # None for a public hf spec
    forced_positions: tuple[int, ...] = ()

    def task(self) -> str:
        """The per-row options as compact JSON (Arrow-friendly: one string column)."""
        return json.dumps([self.spec, list(self.keys) if self.keys is not None else None, list(self.forced_positions)],
                          separators=(",", ":"))


@dataclass(slots=True)
class PreparedJobs:
    """Validated jobs plus what the workers need: shared options, tokenizer and key secrets."""

    jobs: list[DetectJob]
    options: DetectOptions
    vocab: object = field(repr=False)  # watermark.vocab.Vocabulary
    secrets: KeySecrets = field(repr=False)
    # the tested keys' calibrations (public; detector.calibration), so workers hold verdicts to the same null
    calibrations: dict = field(default_factory=dict, repr=False)
    # the table of the deployment's own texts' common units (detector.your_units), verified here, or None
    your_units: object = field(default=None, repr=False)
    # filled by run_local / run_ray, in input order: each verdict's detect-scope view (detector.disclosure.recorded),
    # which store_verdicts records with it (the audit scope alone reads that view, db.verdicts)
    disclosed: list = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.jobs)


# ----------------------------------------------------------------------------------- preparing


def prepare_jobs(records: Iterable[dict], options: DetectOptions, *, keys: Sequence[str] | None = None,
                 spec: str | AnySpec | None = None, vocab=None, keyring=None,
                 bind_keys: bool = True) -> PreparedJobs:
    """Validate ``records`` ({"text", optional "forced_positions", "key"/"keys", "watermark"}) and
    resolve the keys each one is scored with: its own, else ``keys``, else every detection key of
    ``keyring`` bound to the record's spec (the order ``provmark detect`` uses); like the detector, a
    key is scored only under its own spec (``watermark.key_binding``; ``bind_keys=False`` only for the
    evaluation harness). Raises BatchError naming the record (1-based)."""
    keyring = keyring if keyring is not None else Keyring()
    default_spec = _parse_spec(spec, "watermark") if spec is not None else parse_spec(None)
    default_keys = tuple(dict.fromkeys(keys)) if keys else None
    detection_ids: tuple[str, ...] | None = None
    jobs: list[DetectJob] = []
    for number, record in enumerate(records, start=1):
        text, forced, own_spec, own_keys = _record_fields(record, number)
        chosen = own_keys if own_keys is not None else default_keys
        if own_spec is not None:
            record_spec = _parse_spec(own_spec, f"record {number}: watermark")
        elif spec is None and chosen is not None and bind_keys and isinstance(keyring, Keyring):
            record_spec = _keys_own_spec(keyring, chosen, f"record {number}") or default_spec
        else:
            record_spec = default_spec
        if not record_spec.needs_key:
            if own_keys is not None:
                raise BatchError(f"record {number}: keys: an hf spec is public and takes no key")
            chosen = None
        elif chosen is None:
            if detection_ids is None:
                detection_ids = _detection_ids(keyring)
            chosen = detection_ids
        if chosen is not None and bind_keys and isinstance(keyring, Keyring):
            chosen = _bound_keys(keyring, chosen, record_spec, explicit=chosen is not detection_ids,
                                 where=f"record {number}")
        jobs.append(DetectJob(text, record_spec.format(), chosen, forced))
    needed = sorted({k for job in jobs if job.keys for k in job.keys})
    two_part = {i.key_id for i in keyring.list() if i.public_half} if isinstance(keyring, Keyring) else set()
    try:  # a two-part key's published half travels too: workers report what it says (detector.two_part)
        secrets = {**{k: keyring.secret(k) for k in needed},
                   **{public_half_id(k): keyring.public_half(k) for k in needed if k in two_part}}
        dither_key = dither_key_of(keyring)  # so a stored row records the view the service would show
    except KeyringError as exc:  # keyring messages name ids, never secrets
        raise BatchError(str(exc)) from None
    secrets = KeySecrets({**secrets, **({DITHER_ID: dither_key} if dither_key is not None else {})})
    vocab = vocab if vocab is not None else Detector().vocab
    return PreparedJobs(jobs, options, vocab, secrets, shipped_calibrations(keyring, needed),
                        your_units=_your_units(keyring, vocab))


def _your_units(keyring, vocab):
    """The deployment's own common-unit table for ``vocab`` (verified with the master key), for the workers."""
    if not has_master_key(keyring):
        return None
    try:
        store = YourUnits(keyring)
        return store.table(vocab.fingerprint) if store.records() else None
    except KeyringError as exc:
        raise BatchError(str(exc)) from None


def _record_fields(record, number: int):
    if not isinstance(record, dict):
        raise BatchError(f"record {number}: expected an object with a string \"text\" field")
    text = record.get("text")
    if not isinstance(text, str):
        raise BatchError(f'record {number}: expected a string "text" field')
    forced = record.get("forced_positions") or ()
    if not isinstance(forced, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0
                                                    for i in forced):
        raise BatchError(f"record {number}: forced_positions: expected a list of token indices (integers >= 0)")
    own_spec = record.get("watermark")
    if own_spec is not None and not isinstance(own_spec, str):
        raise BatchError(f"record {number}: watermark: expected a spec string")
    own_keys = record.get("keys")
    if own_keys is None:
        own_keys = record.get("key")
    if isinstance(own_keys, str):
        own_keys = (own_keys,)
    if own_keys is not None:
        if not isinstance(own_keys, (list, tuple)) or not own_keys or not all(isinstance(k, str) for k in own_keys):
            raise BatchError(f"record {number}: keys: expected a key id or a non-empty list of key ids")
        own_keys = tuple(dict.fromkeys(own_keys))
    return text, tuple(forced), own_spec, own_keys


def _parse_spec(raw, where: str) -> AnySpec:
    try:
        return parse_spec(raw)
    except SpecError as exc:
        raise BatchError(f"{where}: {exc}") from None


def _bound_keys(keyring, key_ids: tuple[str, ...], spec: AnySpec, explicit: bool, where: str) -> tuple[str, ...]:
    """Named keys must all be bound to ``spec``; of the detection keys, those bound to it (at least one)."""
    try:
        infos = {info.key_id: info for info in keyring.list()}
        if explicit:
            for key_id in key_ids:
                if key_id in infos:  # an unknown id fails later, with the keyring's own message
                    require_bound(infos[key_id], spec)
            return key_ids
        return tuple(info.key_id for info in keys_bound_to([infos[k] for k in key_ids], spec))
    except KeyringError as exc:  # names key ids and their public specs, never secrets
        raise BatchError(f"{where}: {exc}") from None


def _keys_own_spec(keyring, key_ids: tuple[str, ...], where: str) -> AnySpec | None:
    """The named keys' own spec when a record names keys and no spec (as ``provmark detect --key``)."""
    try:
        infos = {info.key_id: info for info in keyring.list()}
        return shared_spec([infos[k] for k in key_ids if k in infos])
    except KeyringError as exc:  # names key ids and their public specs, never secrets
        raise BatchError(f"{where}: {exc}") from None


def _detection_ids(keyring) -> tuple[str, ...]:
    try:
        found = tuple(info.key_id for info in keyring.detection_keys())
    except KeyringError as exc:
        raise BatchError(str(exc)) from None
    if not found:
        raise BatchError("no watermark key to detect with: create one with `provmark keys create`")
    return found


# ------------------------------------------------------------------------------------- workers


class ChunkDetector:
    """The worker: a Detector over shipped material; ``__call__`` scores rows (index, task json, text)."""

    def __init__(self, vocab, secrets: KeySecrets, options: DetectOptions, calibrations: dict | None = None,
                 your_units=None) -> None:
        self._detector = Detector(vocab=vocab, keyring=SecretsKeyring(secrets),
                                  calibrations=ShippedCalibrations(calibrations or {}),
                                  dither_key=secrets.get(DITHER_ID), your_units=your_units)
        self._options = options

    def __repr__(self) -> str:
        return "ChunkDetector()"

    def detect(self, task: str, text: str) -> str:
        """JSON {"verdict": ..., "disclosed": its detect-scope view} or {"error": message} (errors are reported,
        not raised, to name the row)."""
        spec, keys, forced = json.loads(task)
        try:
            verdict = self._detector.detect(text, keys=keys, spec=spec,
                                            options=replace(self._options, forced_positions=forced))
        except (KeyringError, SpecError, ValueError, TypeError) as exc:
            return json.dumps({"error": f"{type(exc).__name__}: {exc}"})
        full, coarse = verdict.views("explain")
        return json.dumps({"verdict": with_spec_fingerprint(full), "disclosed": recorded(coarse)},
                          separators=(",", ":"))

    def __call__(self, batch: dict) -> dict:
        """Ray Data batch (numpy format): columns index, task, text -> index, result."""
        results = [self.detect(t, x) for t, x in zip(batch["task"], batch["text"])]
        return {"index": batch["index"], "result": np.array(results, dtype=object)}


_worker: ChunkDetector | None = None  # the local pool worker's detector, set by its initializer


def _init_local_worker(vocab, secrets: KeySecrets, options: DetectOptions, calibrations: dict, your_units) -> None:
    global _worker
    one_thread_per_process()
    _worker = ChunkDetector(vocab, secrets, options, calibrations, your_units)


def one_thread_per_process() -> None:
    """Workers run one per core: scoring's small tensors and tokenizer calls need no thread pools."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)


def _detect_chunk(rows: list[tuple[int, str, str]]) -> list[tuple[int, str]]:
    return [(index, _worker.detect(task, text)) for index, task, text in rows]


def job_rows(prepared: PreparedJobs) -> list[tuple[int, str, str]]:
    return [(i, job.task(), job.text) for i, job in enumerate(prepared.jobs)]


def collect_results(results: Iterable[tuple[int, str]], total: int, disclosed: list | None = None) -> list[dict]:
    """The verdicts in input order; ``disclosed`` (cleared first) gets each one's detect-scope view."""
    out: list[dict | None] = [None] * total
    views: list[dict | None] = [None] * total
    for index, raw in results:
        answer = json.loads(raw)
        if "error" in answer:
            raise BatchError(f"record {int(index) + 1}: {answer['error']}")
        out[int(index)], views[int(index)] = answer["verdict"], answer.get("disclosed")
    if disclosed is not None:
        disclosed[:] = views
    missing = [i + 1 for i, v in enumerate(out) if v is None]
    if missing:
        raise BatchError(f"{len(missing)} record(s) got no verdict (first: record {missing[0]})")
    return out


def default_workers() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_local(prepared: PreparedJobs, workers: int | None = None, progress: Callable | None = None) -> list[dict]:
    """Verdict dicts in input order, on ``workers`` spawned processes (default: every core; 1 runs in
    this process). ``progress(n)`` is called as chunks of n rows finish."""
    workers = default_workers() if workers is None else workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers: expected a positive integer, got {workers!r}")
    rows = job_rows(prepared)
    chunks = [rows[i:i + CHUNK_ROWS] for i in range(0, len(rows), CHUNK_ROWS)]
    workers = min(workers, max(1, len(chunks)))
    results: list[tuple[int, str]] = []
    if workers == 1:  # in this process: no start-up cost, same worker code
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            worker = ChunkDetector(prepared.vocab, prepared.secrets, prepared.options, prepared.calibrations,
                                   prepared.your_units)
            for chunk in chunks:
                results += [(index, worker.detect(task, text)) for index, task, text in chunk]
                if progress:
                    progress(len(chunk))
        finally:
            torch.set_num_threads(threads)  # the caller may be a longer-lived process
        return collect_results(results, len(rows), prepared.disclosed)
    context = multiprocessing.get_context("spawn")  # no forked torch / tokenizer thread state
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, initializer=_init_local_worker,
                                                initargs=(prepared.vocab, prepared.secrets, prepared.options,
                                                          prepared.calibrations, prepared.your_units)) as pool:
        futures = [pool.submit(_detect_chunk, chunk) for chunk in chunks]
        try:
            for future in concurrent.futures.as_completed(futures):
                done = future.result()
                results += done
                if progress:
                    progress(len(done))
        except concurrent.futures.process.BrokenProcessPool as exc:
            raise BatchError(f"a detection worker died ({exc})") from None
        finally:
            for future in futures:
                future.cancel()
    return collect_results(results, len(rows), prepared.disclosed)
