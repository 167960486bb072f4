"""Batch detection on a Ray cluster (Ray Data ``map_batches`` over an actor pool): the same verdicts as
``detector.batch.run_local``, in input order. Key secrets reach the actors only sealed
(detector/batch_secrets.py); the transport key travels apart in the actors' runtime_env."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from detector.batch import (
    CHUNK_ROWS,
    BatchError,
    ChunkDetector,
    PreparedJobs,
    collect_results,
    job_rows,
    one_thread_per_process,
)
from detector.batch_secrets import TRANSPORT_KEY_ENV, open_secrets, seal_secrets


def run_ray(prepared: PreparedJobs, address: str | None = None, workers: int | None = None,
            progress: Callable | None = None) -> list[dict]:
    """The same job through Ray Data on the cluster at ``address`` (None: ``ray.init()``'s default,
    RAY_ADDRESS or a new local instance; already connected: that one). ``workers`` actors (default:
    the cluster's CPUs), one CPU each. Verdicts in input order."""
    import ray  # noqa: PLC0415 (Ray, heavy and optional: evaluation.scorer imports this module for every backend)

    started_here = connect_ray(address)
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # the caller's bar reports progress
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the caller's bar counts rows instead
        context.execution_options.preserve_order = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        actors = max(1, min(workers or cpus, cpus))
        rows = job_rows(prepared)
        items = [{"index": index, "task": task, "text": text} for index, task, text in rows]
        dataset = ray.data.from_items(items, override_num_blocks=max(1, -(-len(rows) // CHUNK_ROWS)))
        sealed, transport_key = seal_secrets(prepared.secrets)
        material = [ray.put(prepared.vocab), sealed, prepared.options, prepared.calibrations, prepared.your_units]
        scored = dataset.map_batches(_RayChunkDetector, fn_constructor_kwargs={"material": material},
                                     batch_size=CHUNK_ROWS, batch_format="numpy", num_cpus=1,
                                     compute=ray.data.ActorPoolStrategy(size=actors),
                                     runtime_env={"env_vars": {TRANSPORT_KEY_ENV: transport_key}})
        results = []
        for batch in scored.iter_batches(batch_size=CHUNK_ROWS, batch_format="numpy"):
            results += zip(batch["index"].tolist(), batch["result"].tolist())
            if progress:
                progress(len(batch["index"]))
    except ray.exceptions.RayError as exc:
        raise BatchError(f"the Ray job failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
    finally:
        if started_here:
            ray.shutdown()
    return collect_results(results, len(rows), prepared.disclosed)


def connect_ray(address: str | None = None) -> bool:
    """Connect to (or start) Ray unless already connected; True when this call connected."""
    import ray  # noqa: PLC0415 (Ray, heavy and optional: loads for a Ray run only)

    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}})
    return True


class _RayChunkDetector(ChunkDetector):
    """Ray Data actor: unpacks the shipped material (the tokenizer by object ref) once per actor."""

    def __init__(self, material) -> None:
        import ray  # noqa: PLC0415 (Ray, heavy and optional: loads for a Ray run only)

        vocab_ref, sealed, options, calibrations, your_units = material
        one_thread_per_process()
        transport_key = os.environ.pop(TRANSPORT_KEY_ENV, "")  # gone from the env once read
        super().__init__(ray.get(vocab_ref), open_secrets(sealed, transport_key), options, calibrations, your_units)
