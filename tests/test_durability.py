"""Durability: the detector runs as a real gunicorn process group (2 workers) on SQLite (WAL); 8 clients
post detections; the whole group is killed with SIGKILL mid-run and restarted; clients keep posting.
Every request that got a 200 must have its verdict stored, and the audit chain must still verify.
Then one audit row is edited by raw SQL: /v1/audit/verify must fail and name that event."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from http_fixtures import call, human_text

from watermark.keys import Keyring

pytest_plugins = ["pg"]

REPO = Path(__file__).resolve().parent.parent
CLIENTS = 8
WORKERS = 2
OK_BEFORE_KILL = 40  # successful detections before the SIGKILL
OK_AFTER_RESTART = 40  # and after the restart
START_TIMEOUT_S = 120.0  # imports + tokenizer load on a busy 2-core machine
REQUEST_TIMEOUT_S = 15.0
PHASE_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DetectorProcess:
    """``python -m api.detector.wsgi`` in its own process group (so SIGKILL reaches every worker)."""

    def __init__(self, home: Path, port: int, log_dir: Path, database_url: str | None = None):
        self.home, self.port, self.log_dir, self.database_url = home, port, log_dir, database_url
        self.base_url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = {**os.environ, "PROVMARK_HOME": str(self.home), "PROVMARK_RATE_LIMIT": "1000000",
               "PYTHONPATH": str(REPO)}
        env.pop("PROVMARK_DATABASE_URL", None)  # SQLite in the home folder, unless given
        if self.database_url is not None:
            env["PROVMARK_DATABASE_URL"] = self.database_url
        with open(self.log_dir / f"server-{self.starts}.log", "wb") as out:  # the child keeps its own copy
            self.process = subprocess.Popen(
                [sys.executable, "-m", "api.detector.wsgi", "--host", "127.0.0.1", "--port", str(self.port),
                 "--workers", str(WORKERS)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"detector exited with {self.process.returncode}: {self.log()}")
            try:
                if call("GET", self.base_url + "/healthz", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"detector did not start in {START_TIMEOUT_S} s: {self.log()}")

    def kill(self) -> None:
        """SIGKILL the master and every worker at once, then reap the master."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def log(self) -> str:
        return (self.log_dir / f"server-{self.starts}.log").read_text(errors="replace")[-3000:]


class Clients:
    """CLIENTS threads posting detections until stopped; they remember every 200 they got."""

    def __init__(self, base_url: str, token: str, texts: list[str]):
        self.base_url, self.token, self.texts = base_url, token, texts
        self.ok: list[tuple[str, str]] = []  # (verdict id, text sha256)
        self.failures = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def _run(self, index: int) -> None:
        n = index
        while not self.stop.is_set():
            text = self.texts[n % len(self.texts)]
            n += CLIENTS
            try:
                status, body, _ = call("POST", self.base_url + "/v1/detect", {"text": text}, token=self.token,
                                       timeout=REQUEST_TIMEOUT_S)
            except (OSError, ValueError):  # refused, reset or cut off while the server is down
                status, body = None, None
            with self.lock:
                if status == 200:
                    self.ok.append((body["id"], body["text_sha256"]))
                else:
                    self.failures += 1
            if status != 200:
                time.sleep(0.05)

    def count(self) -> int:
        with self.lock:
            return len(self.ok)

    def wait_for(self, target: int) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while self.count() < target:
            assert time.monotonic() < deadline, f"only {self.count()} successful detections, wanted {target}"
            time.sleep(0.05)


def burst_with_a_kill(server: DetectorProcess, home: Path) -> str:
    """Clients post through a SIGKILL and a restart; every acknowledged verdict must read back. The admin token."""
    texts = [human_text(1200, start) for start in range(0, 60000, 6000)]
    server.start()
    token = (home / "admin.token").read_text().strip()
    clients = Clients(server.base_url, token, texts)
    for thread in clients.threads:
        thread.start()
    clients.wait_for(OK_BEFORE_KILL)
    server.kill()
    acknowledged_at_kill = clients.count()
    server.start()
    clients.wait_for(acknowledged_at_kill + OK_AFTER_RESTART)
    clients.stop.set()
    for thread in clients.threads:
        thread.join(timeout=REQUEST_TIMEOUT_S + 5)

    for verdict_id, sha in clients.ok:
        status, stored, _ = call("GET", f"{server.base_url}/v1/verdicts/{verdict_id}", token=token)
        assert status == 200, f"acknowledged verdict {verdict_id} is missing after the SIGKILL"
        assert stored["text_sha256"] == sha
    assert len({verdict_id for verdict_id, _ in clients.ok}) == len(clients.ok)
    assert clients.failures > 0  # the kill did land while clients were posting
    status, report, _ = call("GET", server.base_url + "/v1/audit/verify", token=token)
    assert status == 200 and report["ok"] is True, report["problems"]
    assert report["events"] >= len(clients.ok) + 1  # every detection + the bootstrap token
    return token


def test_sigkill_mid_run_on_postgresql_loses_no_acknowledged_verdict(provmark_home, tmp_path, postgresql_url):
    Keyring(provmark_home).create("k-durable")
    server = DetectorProcess(provmark_home, free_port(), tmp_path, postgresql_url)
    try:
        burst_with_a_kill(server, provmark_home)
    finally:
        server.kill()


def test_sigkill_mid_run_loses_no_acknowledged_verdict(provmark_home, tmp_path):
    Keyring(provmark_home).create("k-durable")
    server = DetectorProcess(provmark_home, free_port(), tmp_path)
    try:
        token = burst_with_a_kill(server, provmark_home)

        # Hand-edit one stored detection event: verify must fail and name exactly that event.
        with sqlite3.connect(provmark_home / "provmark.db") as db:
            seq, event_id, details = db.execute(
                "SELECT seq, event_id, details FROM audit_events WHERE kind = 'detection' "
                "ORDER BY seq LIMIT 1 OFFSET 10").fetchone()
            edited = json.loads(details)
            edited["verdict"] = "watermarked" if edited["verdict"] != "watermarked" else "not_watermarked"
            db.execute("UPDATE audit_events SET details = ? WHERE seq = ?",
                       (json.dumps(edited, sort_keys=True, separators=(",", ":")), seq))
        status, report, _ = call("GET", server.base_url + "/v1/audit/verify", token=token)
        assert status == 200 and report["ok"] is False
        assert [(p["seq"], p["event_id"], p["problem"]) for p in report["problems"]] == [(seq, event_id, "edited")]
    finally:
        server.kill()

