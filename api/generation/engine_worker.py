"""One engine, one background thread: HTTP threads submit requests and wait on (or stream from) their own queue.

The worker thread is the only caller of ``Engine.step()``. It sleeps while the engine has nothing to do
and wakes when a request is submitted or aborted; every step's outputs are routed to the queue of the
request they belong to. Requests that arrive while a step runs join the running batch at the next
step (continuous batching), so concurrent HTTP requests share forward passes. ``stats()`` reports the
largest batch seen, which is how tests show that sharing happened.

Thread safety: ``submit``, ``cancel`` and ``stats`` may be called from any thread; the handle of a
request is read by the one thread that submitted it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from api.settings import DEFAULT_MAX_PENDING

log = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3  # engine.step() errors in a row before the worker declares itself broken


class WorkerUnavailable(Exception):
    """The worker is stopped, broken or full: the request was not run (services answer 503)."""


class GenerationFailed(Exception):
    """The engine failed while running this request (services answer 500)."""


@dataclass(slots=True)
class WorkerStats:
    """Counters since start; ``max_batch_size`` is the most requests that advanced in one step."""

    steps: int = 0
    max_batch_size: int = 0
    shared_steps: int = 0  # steps that advanced more than one request
    requests_submitted: int = 0
    requests_finished: int = 0
    tokens_generated: int = 0
    in_flight: int = 0
    failures: int = 0
    alive: bool = False
    broken: bool = False


class GenerationHandle:
    """A submitted request: read its outputs with ``outputs()`` (streaming) or ``result()``."""

    __slots__ = ("_done", "_queue", "_worker", "request_id", "streaming")

    def __init__(self, worker: EngineWorker, request_id: str, streaming: bool) -> None:
        self.request_id = request_id
        self.streaming = streaming  # False: only the final output is queued
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = worker
        self._done = False

    def _deliver(self, item) -> None:
        self._queue.put(item)

    def outputs(self, timeout: float | None = None) -> Iterator:
        """Each RequestOutput as the engine produces it (only the last one unless streaming), ending
        with the finished one. Raises GenerationFailed / WorkerUnavailable if the engine fails or stops;
        queue.Empty after ``timeout`` seconds without output."""
        while not self._done:
            item = self._queue.get(timeout=timeout)
            if isinstance(item, BaseException):
                self._done = True
                raise item
            if item.finished:
                self._done = True
            yield item

    def result(self, timeout: float | None = None):
        """The finished RequestOutput."""
        last = None
        for last in self.outputs(timeout):
            pass
        return last

    def cancel(self) -> None:
        """Stop the request (idempotent); nothing more is delivered."""
        if not self._done:
            self._done = True
            self._worker.cancel(self.request_id)


class EngineWorker:
    """Drives one ``generation.engine.Engine`` from a daemon thread; see the module docstring."""

    def __init__(self, engine, max_pending: int = DEFAULT_MAX_PENDING, name: str = "provmark-engine") -> None:
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending={max_pending!r}: must be a positive int")
        self.engine = engine
        self.max_pending = max_pending
        self._handles: dict[str, GenerationHandle] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._holds = 0  # > 0: the loop does not step (tests line requests up, then release)
        self._stats = WorkerStats()
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EngineWorker:
        with self._cond:
            self._stats.alive = True
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the current step, stop the thread, and fail every waiting request (idempotent)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        with self._cond:
            handles, self._handles = list(self._handles.values()), {}
            self._stats.alive = False
            self._stats.in_flight = 0
        for handle in handles:
            handle._deliver(WorkerUnavailable("the generation engine is shutting down"))

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While inside, submitted requests wait and no step runs; on exit they start together."""
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    # ------------------------------------------------------------------ requests
    def submit(self, prompt, params, watermark=None, *, streaming: bool = False) -> GenerationHandle:
        """Queue a request on the engine. Raises ValueError/TypeError from ``Engine.submit`` for a bad
        request (prompt too long, ids out of range), WorkerUnavailable when stopped, broken or full."""
        request_id = f"{self._prefix}-{next(self._ids)}"
        handle = GenerationHandle(self, request_id, streaming)
        with self._cond:
            if self._stopping or not self._stats.alive:
                raise WorkerUnavailable("the generation engine is not running")
            if self._stats.broken:
                raise WorkerUnavailable("the generation engine failed and must be restarted")
            if len(self._handles) >= self.max_pending:
                raise WorkerUnavailable(f"the generation engine is full ({self.max_pending} requests in flight)")
            # registered before the engine can produce output for it
            self._handles[request_id] = handle
            self._stats.in_flight = len(self._handles)
        try:
            self.engine.submit(prompt, params, watermark, request_id=request_id)
        except BaseException:
            with self._cond:
                self._handles.pop(request_id, None)
                self._stats.in_flight = len(self._handles)
            raise
        with self._cond:
            self._stats.requests_submitted += 1
            self._cond.notify_all()
        return handle

    def cancel(self, request_id: str) -> None:
        with self._cond:
            if self._handles.pop(request_id, None) is None:
                return
            self._stats.in_flight = len(self._handles)
        self.engine.abort(request_id)
        with self._cond:
            self._cond.notify_all()

    def stats(self) -> dict:
        with self._cond:
            return asdict(self._stats)

    def waiting_requests(self) -> int:
        """Requests submitted and not yet finished (held or running)."""
        with self._cond:
            return len(self._handles)

    def occupancy(self) -> tuple[int, int]:
        """(sequences in the running batch, requests accepted and not yet running), for /metrics.

        Read without pausing the engine: a scrape may see a step half-way, never a wrong type."""
        scheduler = getattr(self.engine, "scheduler", None)
        running = len(getattr(scheduler, "running", ()))
        with self._cond:
            in_flight = len(self._handles)
        return running, max(0, in_flight - running)

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._stopping and (self._holds or not self.engine.has_unfinished()):
                    self._cond.wait()
                if self._stopping:
                    return
            try:
                outputs = self.engine.step()
            except Exception:
                failures += 1
                log.exception("engine step failed (%d in a row)", failures)
                self._fail_all(failures >= MAX_CONSECUTIVE_FAILURES)
                if failures >= MAX_CONSECUTIVE_FAILURES:
                    return
                continue
            failures = 0
            self._dispatch(outputs)

    def _dispatch(self, outputs: list) -> None:
        advanced = sum(1 for out in outputs if out.finish_reason != "abort")
        with self._cond:
            stats = self._stats
            stats.steps += 1
            stats.max_batch_size = max(stats.max_batch_size, advanced)
            stats.shared_steps += advanced > 1
            stats.tokens_generated += advanced
            targets = []
            for out in outputs:
                handle = self._handles.get(out.request_id)
                if handle is None:
                    continue  # cancelled: nobody is listening
                if out.finished:
                    del self._handles[out.request_id]
                    stats.requests_finished += 1
                    targets.append((handle, out))
                elif handle.streaming:
                    targets.append((handle, out))
            stats.in_flight = len(self._handles)
        for handle, out in targets:
            handle._deliver(out)

    def _fail_all(self, broken: bool) -> None:
        """Fail every request in flight and abort it in the engine, so the next step can clean up."""
        with self._cond:
            handles, self._handles = list(self._handles.values()), {}
            self._stats.failures += 1
            self._stats.broken = broken
            self._stats.in_flight = 0
            if broken:
                self._stats.alive = False
        for handle in handles:
            self.engine.abort(handle.request_id)
            handle._deliver(GenerationFailed("the generation engine failed while running this request"))


__all__ = ["EngineWorker", "GenerationFailed", "GenerationHandle", "WorkerStats",
           "WorkerUnavailable"]
