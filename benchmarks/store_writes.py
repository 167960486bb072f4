"""Verdict writes per second: ``Store.record_verdict`` (verdict row + its ``detection`` audit event in
one ``Store.write()`` transaction, exactly what POST /v1/detect does) under 1, 4 and 16 concurrent writers.

    python benchmarks/store_writes.py [--n 500] [--writers 1,4,16] [--modes threads,processes]
                                      [--backends sqlite,postgresql,postgresql-durable] [--out FILE]

Backends, each configuration on a fresh, migrated (``Store.upgrade()``) database:
  sqlite              the default store: a temp file, WAL, BEGIN IMMEDIATE, SQLite's default synchronous
  postgresql          a throwaway server started by tests/pg.py (fsync=off, synchronous_commit=off)
  postgresql-durable  the same server restarted with fsync=on, synchronous_commit=on,
                      full_page_writes=on (a production-like commit that waits for the WAL flush)
Backends run in that order (the durable restart is one-way).
Modes: ``threads`` share one Store (one service process); ``processes`` each open their own Store
(forked like gunicorn's sync workers, one connection each). Each writer makes one untimed warm-up
write (opens its connection), waits on a barrier, then stores ``--n`` verdicts back to back.

Reported per configuration: verdicts/s = all timed writes / (last writer end - first writer start),
per-write latency p50/p99/max in ms, and ms per write at that rate (the serial cost when writers
queue on one lock). After each run: ``db.audit.verify`` must be ok, and the verdict rows,
audit events and chain head seq must all equal the writes made. On PostgreSQL a sampler thread reads
``pg_stat_activity`` every ``--sample-ms`` ms and reports what the writers' backends were doing
(waiting on a row lock = the audit head; idle in transaction = waiting for Python mid-transaction).
"""

from __future__ import annotations

import argparse
import atexit
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, select
from tqdm import tqdm

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/pg.py: the throwaway PostgreSQL server the tests use

from api.detector.schemas import DetectRequest
from benchmarks.common import machine, write_json
from db import audit
from db.caller import Caller
from db.rows import AuditEventRow, VerdictRow, text_sha256
from db.store import Store
from db.verdicts import VerdictRecord
from watermark.config import WatermarkSpec

BACKENDS = ("sqlite", "postgresql", "postgresql-durable")
MODES = ("threads", "processes")
# What a production PostgreSQL commits with (the defaults tests/pg.py turns off for speed).
DURABLE_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
TEXT_CHARS = 4000  # about 1,000 tokens of English, the detector benchmarks' text size
BARRIER_TIMEOUT_S = 120.0
PROGRESS_POLL_S = 0.2


@dataclass(slots=True)
class Params:
    n: int
    writers: list[int]
    modes: list[str]
    backends: list[str]
    sample_ms: int

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"n: expected a positive integer, got {self.n}")
        if not self.writers or any(w < 1 for w in self.writers):
            raise ValueError(f"writers: expected positive integers, got {self.writers}")
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes: expected some of {', '.join(MODES)}, got {self.modes}")
        if not self.backends or set(self.backends) - set(BACKENDS):
            raise ValueError(f"backends: expected some of {', '.join(BACKENDS)}, got {self.backends}")
        if self.sample_ms < 1:
            raise ValueError(f"sample_ms: expected a positive integer, got {self.sample_ms}")


@dataclass(slots=True)
class WriterResult:
    start: float  # perf_counter (CLOCK_MONOTONIC: comparable across processes on Linux)
    end: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def sample_record(i: int) -> tuple[VerdictRecord, str]:
    """A verdict shaped like the detect route's (default spec, one key, default options) and its text."""
    text = (f"benchmark text {i} " * (TEXT_CHARS // 16))[:TEXT_CHARS]
    spec = WatermarkSpec.default().format()
    options = DetectRequest(text=text).model_dump(exclude={"text"})
    options["keys_tested"] = ["k_bench"]
    # every row records its detect-scope view (api/detector/routes_detect.py), which revision 0006 indexes
    options["disclosed"] = {"disclosure": "coarse-dithered/v1", "verdict": "not_watermarked", "z_score": 0.0,
                            "p_value": 1.0, "key_id": None, "decided_by": None, "windows": None,
                            "spoof_suspected": None, "matches_own_output": None}
    record = VerdictRecord(
        text_sha256=text_sha256(text), verdict="not_watermarked", z=0.42 + i % 7, p_value=0.3,
        green_count=260, scored_count=1000, green_fraction=0.26, spec=spec,
        spec_fingerprint=text_sha256(spec), tokenizer_fingerprint=text_sha256("tokenizer"),
        key_id="k_bench", options=options, windows=None)
    return record, text


def write_verdicts(store: Store, n: int, barrier, progress) -> WriterResult:
    """One writer: a warm-up write, the barrier, then ``n`` timed ``record_verdict`` calls."""
    caller = Caller(name="bench", token_id=str(uuid.uuid4()))
    record, text = sample_record(os.getpid() + threading.get_ident())
    store.record_verdict(record, caller, text=text)
    barrier.wait(BARRIER_TIMEOUT_S)
    result = WriterResult(start=time.perf_counter(), end=0.0)
    for _ in range(n):
        began = time.perf_counter()
        try:
            store.record_verdict(record, caller, text=text)
        except Exception as error:  # noqa: BLE001 - counted and reported; the row count check uses successes
            result.errors.append(f"{type(error).__name__}: {error}"[:200])
        else:
            result.latencies_ms.append((time.perf_counter() - began) * 1e3)
        with progress.get_lock():
            progress.value += 1
    result.end = time.perf_counter()
    return result


def _process_writer(url: str, n: int, barrier, progress, results) -> None:
    store = Store(url, retain_text=False)  # each gunicorn worker opens its own engine and connection
    try:
        results.put(write_verdicts(store, n, barrier, progress))
    except Exception as error:  # noqa: BLE001 - the parent reports it instead of hanging on the queue
        results.put(WriterResult(0.0, 0.0, errors=[f"{type(error).__name__}: {error}"[:200]]))
    finally:
        store.close()


class ActivitySampler(threading.Thread):
    """Counts what the writers' PostgreSQL backends are doing, every ``interval_s`` seconds."""

    def __init__(self, conninfo: str, interval_s: float):
        super().__init__(daemon=True)
        self.conninfo, self.interval_s = conninfo, interval_s
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self._halt = threading.Event()

    def run(self) -> None:
        import psycopg

        query = ("SELECT state, wait_event_type, wait_event FROM pg_stat_activity "
                 "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                 "AND backend_type = 'client backend'")
        with psycopg.connect(self.conninfo, autocommit=True) as connection:
            while not self._halt.wait(self.interval_s):
                self.samples += 1
                for state, wait_type, wait_event in connection.execute(query):
                    self.counts[_classify(state, wait_type, wait_event)] += 1

    def stop(self) -> dict:
        self._halt.set()
        self.join()
        total = sum(self.counts.values()) or 1
        return {"samples": self.samples,
                "backend_states": {k: round(v / total, 3) for k, v in self.counts.most_common()}}


def _classify(state: str | None, wait_type: str | None, wait_event: str | None) -> str:
    if state == "active":
        if wait_type == "Lock":
            return f"waiting_row_lock({wait_event})"  # transactionid/tuple: queued on the audit head row
        return f"active_wait({wait_type}:{wait_event})" if wait_type else "active_cpu"
    if state == "idle in transaction":
        return "idle_in_transaction"  # the server waits for Python mid-transaction (maybe holding the head)
    return str(state)  # idle: between transactions (Python work, pool, latency bookkeeping)


def run_config(url: str, mode: str, writers: int, n: int, bar: tqdm, sampler: ActivitySampler | None) -> dict:
    """Run ``writers`` concurrent writers of ``n`` verdicts each against a fresh database at ``url``."""
    migrator = Store(url)
    migrator.upgrade()
    migrator.close()  # no connection of the parent's is left open (or forked) while writers run
    if mode == "threads":
        barrier, progress = threading.Barrier(writers + 1), multiprocessing.Value("q", 0)
        store = Store(url, retain_text=False)
        results: list[WriterResult] = []
        threads = [threading.Thread(target=lambda: results.append(write_verdicts(store, n, barrier, progress)))
                   for _ in range(writers)]
        for thread in threads:
            thread.start()
        _release(barrier, progress, writers * n, bar, sampler, lambda: any(t.is_alive() for t in threads))
        for thread in threads:
            thread.join()
        store.close()
    else:
        context = multiprocessing.get_context("fork")  # like gunicorn: workers forked from a parent
        barrier, progress, queue = context.Barrier(writers + 1), context.Value("q", 0), context.Queue()
        processes = [context.Process(target=_process_writer, args=(url, n, barrier, progress, queue))
                     for _ in range(writers)]
        for process in processes:
            process.start()
        _release(barrier, progress, writers * n, bar, sampler, lambda: any(p.is_alive() for p in processes))
        results = [queue.get() for _ in processes]
        for process in processes:
            process.join()
    activity = sampler.stop() if sampler is not None else None  # before the checks read the database
    summary = summarise(url, results, writers, n)
    if activity is not None:
        summary["pg_activity"] = activity
    return summary


def _release(barrier, progress, total: int, bar: tqdm, sampler: ActivitySampler | None, alive) -> None:
    """Start the sampler, release the writers together, and follow their progress until done."""
    barrier.wait(BARRIER_TIMEOUT_S)
    if sampler is not None:
        sampler.start()
    shown = 0
    while shown < total and alive():
        time.sleep(PROGRESS_POLL_S)
        done = progress.value
        bar.update(done - shown)
        shown = done


def summarise(url: str, results: list[WriterResult], writers: int, n: int) -> dict:
    latencies = sorted(ms for r in results for ms in r.latencies_ms)
    errors = [e for r in results for e in r.errors]
    wall_s = max(r.end for r in results) - min(r.start for r in results)
    writes = len(latencies)
    check = check_store(url, expected=writes + writers)  # + one warm-up write per writer
    return {
        "writers": writers,
        "n_per_writer": n,
        "writes": writes,
        "errors": len(errors),
        "first_errors": errors[:3],
        "wall_s": round(wall_s, 3),
        "verdicts_per_s": round(writes / wall_s, 1),
        "ms_per_write_at_that_rate": round(wall_s * 1e3 / max(writes, 1), 3),
        "latency_ms": {"p50": round(percentile(latencies, 50), 3), "p99": round(percentile(latencies, 99), 3),
                       "max": round(latencies[-1], 3) if latencies else None},
        "check": check,
    }


def check_store(url: str, expected: int) -> dict:
    """The chain verifies and verdicts, detection events and the head seq each equal ``expected``."""
    store = Store(url)
    try:
        report = audit.verify(store)
        with store.read() as session:
            verdicts = session.scalar(select(func.count()).select_from(VerdictRow))
            events = session.scalar(select(func.count()).select_from(AuditEventRow)
                                    .where(AuditEventRow.kind == "detection"))
    finally:
        store.close()
    ok = report.ok and verdicts == events == report.head_seq == report.events == expected
    return {"ok": ok, "chain_ok": report.ok, "expected_rows": expected, "verdict_rows": verdicts,
            "detection_events": events, "head_seq": report.head_seq, "problems": len(report.problems)}


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of an ascending list; NaN when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def start_postgres():
    """tests/pg.py's throwaway server (initdb + pg_ctl in a temp dir, as the postgres user under root)."""
    from pg import PostgresServer, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("PostgreSQL server binaries not found (apt-get install postgresql)")
    server = PostgresServer(bin_dir)
    atexit.register(server.stop)  # stop() is idempotent; also covers an interrupted run
    return server


def make_durable(server) -> None:
    """Restart the server with fsync, synchronous_commit and full_page_writes on (tests/pg.py passes
    them off with -c, which outranks ALTER SYSTEM, so only a restart with new options turns them on)."""
    settings = " ".join(f"-c {name}={value}" for name, value in DURABLE_SETTINGS.items())
    options = (f"-p {server.port} -k {server.socket_dir} -c listen_addresses=127.0.0.1 {settings} "
               "-c max_connections=50")  # otherwise the options tests/pg.py starts it with
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # as tests/pg.py
    command = [*run_as, str(server.bin_dir / "pg_ctl"), "restart", "-w", "-m", "fast", "-t", "60",
               "-D", str(server.data_dir), "-l", str(server.root / "server.log"), "-o", options]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)


def server_settings(server) -> dict[str, str]:
    """SHOW of the settings that decide what a commit waits for."""
    import psycopg

    conninfo = f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"
    with psycopg.connect(conninfo, autocommit=True) as connection:
        return {name: connection.execute(f"SHOW {name}").fetchone()[0] for name in
                ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method")}


def sqlite_settings(url: str) -> dict:
    store = Store(url)
    try:
        with store.read() as session:
            connection = session.connection()
            return {name: connection.exec_driver_sql(f"PRAGMA {name}").scalar()
                    for name in ("journal_mode", "synchronous", "busy_timeout")}
    finally:
        store.close()


def run_backend(backend: str, params: Params, folder: str, server, bar: tqdm) -> dict:
    """Every mode x writer count on one backend, each on a fresh database; plus the backend's settings."""
    runs = []
    for mode in params.modes:
        for writers in params.writers:
            bar.set_postfix_str(f"{backend} {mode} x{writers}")
            sampler = None
            if backend == "sqlite":
                url = f"sqlite:///{folder}/{mode}-{writers}.db"
            else:
                url = server.create_database()
                sampler = ActivitySampler(f"host=127.0.0.1 port={server.port} user=postgres "
                                          f"dbname={url.rsplit('/', 1)[1]}", params.sample_ms / 1e3)
            runs.append({"mode": mode, **run_config(url, mode, writers, params.n, bar, sampler)})
    settings = sqlite_settings(url) if backend == "sqlite" else server_settings(server)
    return {"settings": settings, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=500, help="timed verdicts per writer")
    parser.add_argument("--writers", default="1,4,16", help="comma-separated writer counts")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--sample-ms", type=int, default=50, help="pg_stat_activity sampling period")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    try:
        params = Params(n=args.n, writers=[int(w) for w in args.writers.split(",")],
                        modes=args.modes.split(","), backends=args.backends.split(","), sample_ms=args.sample_ms)
        params.backends.sort(key=BACKENDS.index)  # the durable restart is one-way: it runs last
    except ValueError as error:
        parser.error(str(error))
    tqdm.monitor_interval = 0  # no tqdm monitor thread alive when writer processes fork
    load_before = [round(x, 2) for x in os.getloadavg()]  # other work on the machine skews every figure

    total = len(params.backends) * len(params.modes) * sum(params.writers) * params.n
    results: dict[str, dict] = {}
    server = None
    with tempfile.TemporaryDirectory(prefix="provmark-store-writes-") as folder, \
            tqdm(total=total, unit="verdict", desc="store writes", file=sys.stderr) as bar:
        try:
            for backend in params.backends:
                if backend.startswith("postgresql") and server is None:
                    server = start_postgres()
                if backend == "postgresql-durable":
                    make_durable(server)
                results[backend] = run_backend(backend, params, folder, server, bar)
        finally:
            if server is not None:
                server.stop()

    all_ok = all(run["check"]["ok"] and run["errors"] == 0 for b in results.values() for run in b["runs"])
    payload = {
        "benchmark": "store_writes",
        "command": "python benchmarks/store_writes.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "operation": "Store.record_verdict: INSERT verdict, flush, lock audit_head, INSERT audit event, "
                     "UPDATE head, COMMIT (one Store.write() transaction, as POST /v1/detect)",
        "load_average_at_start": load_before,
        "text_chars": TEXT_CHARS,
        "retain_text": False,
        "all_checks_ok": all_ok,
        "results": results,
        "note": "verdicts/s counts the timed writes of all writers over the wall time from the barrier to "
                "the last writer's end. Every commit appends to one hash chain, so writers serialise on "
                "the audit head: SQLite's BEGIN IMMEDIATE takes the database write lock for the whole "
                "transaction; PostgreSQL's SELECT ... FOR UPDATE on audit_head holds the row lock from "
                "the event append to COMMIT (the verdict INSERT runs before it). 2 cores are shared by "
                "the writers, the database server and the sampler. Threads share one Store, whose SQLAlchemy pool "
                "holds at most 15 connections (5 + 10 overflow), so 16 threads keep at most 15 in the database.",
    }
    write_json("store_writes", payload, args.out)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
