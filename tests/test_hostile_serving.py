"""Hostile clients against both services as `provmark serve` runs them (gunicorn, real sockets):
half-sent requests and idle connections do not starve a service,
bodies past the limit are refused from their Content-Length, gunicorn's own refusals are JSON,
/metrics sums over workers, and the bootstrap admin token stays out of the service's output.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from http_fixtures import call, human_text

from watermark.keys import Keyring

REPO = Path(__file__).resolve().parent.parent
ATTACKERS = 64
ANSWER_WITHIN_S = 1.0
START_TIMEOUT_S = 180.0  # the generation service loads the model


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    """``python -m api.cli serve NAME`` in its own process group, output captured like a log."""

    def __init__(self, name: str, home: Path, log: Path, workers: int | None = None):
        self.name, self.home, self.log_path = name, home, log
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PROVMARK_HOME": str(home), "PYTHONPATH": str(REPO), "PROVMARK_RATE_LIMIT": "100000"}
        for name_ in ("PROVMARK_DATABASE_URL", "PROMETHEUS_MULTIPROC_DIR"):
            env.pop(name_, None)
        argv = [sys.executable, "-m", "api.cli", "serve", name, "--port", str(self.port)]
        if workers is not None:
            argv += ["--workers", str(workers)]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"{name} exited: {self.output()[-2000:]}"
            try:
                if call("GET", self.url + "/healthz", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.25)
        else:
            raise AssertionError(f"{name} did not start: {self.output()[-2000:]}")
        self.token = (home / "admin.token").read_text().strip()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=45)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("serving-home")
    Keyring(home).create("k-serving")
    return home


@pytest.fixture(scope="module")
def detector(home, tmp_path_factory):
    service = Service("detector", home, tmp_path_factory.mktemp("logs") / "detector.log", workers=2)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def generation(home, detector, tmp_path_factory):  # after the detector: it made the admin token
    service = Service("generation", home, tmp_path_factory.mktemp("logs") / "generation.log")
    yield service
    service.stop()


def _hold(url: str, payload: bytes, n: int = ATTACKERS) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=10)
        if payload:
            sock.sendall(payload)
        socks.append(sock)
    time.sleep(0.5)  # let the server take them all in
    return socks


def _timed(method: str, url: str, body=None, token=None) -> tuple[int, object, float]:
    start = time.monotonic()
    status, answer, _ = call(method, url, body, token=token, timeout=30)
    return status, answer, time.monotonic() - start


def _raw(url: str, request: bytes) -> tuple[int, dict, bytes]:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(body) >= length:
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {line.split(b":")[0].strip().lower(): line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")[1:]}
    assert headers.get(b"content-type", b"").startswith(b"application/json"), data[:400]
    return int(head.split()[1]), json.loads(body), head


HALF_SENT = [b"GET /healthz HTTP/1.1\r\nHost: x\r\n",  # headers never finished
             b"",  # connected, nothing sent
             b"POST /v1/detect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{\"te"]


@pytest.mark.parametrize("payload", HALF_SENT, ids=["half-headers", "idle", "half-body"])
def test_the_detector_answers_while_64_clients_hold_half_sent_requests(detector, payload):
    socks = _hold(detector.url, payload)
    try:
        status, _, took = _timed("GET", detector.url + "/healthz")
        assert status == 200 and took < ANSWER_WITHIN_S, took
        status, body, took = _timed("POST", detector.url + "/v1/detect", {"text": human_text(600)}, detector.token)
        assert status == 200 and took < ANSWER_WITHIN_S * 3, (status, took)  # scoring itself takes a few 100 ms here
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.slow
@pytest.mark.parametrize("payload", HALF_SENT[:2], ids=["half-headers", "idle"])
def test_the_generation_service_answers_while_64_clients_hold_half_sent_requests(generation, payload):
    socks = _hold(generation.url, payload)
    try:
        status, _, took = _timed("GET", generation.url + "/healthz")
        assert status == 200 and took < ANSWER_WITHIN_S, took
        status, body, took = _timed("POST", generation.url + "/v1/generate",
                                    {"prompt": "Hi", "max_new_tokens": 2, "watermark": None}, generation.token)
        assert status == 200 and took < ANSWER_WITHIN_S * 3, (status, body, took)
    finally:
        for sock in socks:
            sock.close()


def test_an_idle_connection_is_closed_by_the_server(detector):
    (sock,) = _hold(detector.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", n=1)
    with sock:
        sock.settimeout(30)
        data = b""
        while chunk := sock.recv(65536):  # the answer, then the server closes the kept-alive connection
            data += chunk
        assert data.startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("which", ["detector", "generation"])
def test_a_body_past_the_limit_is_refused_from_its_content_length(request, which):
    service = request.getfixturevalue(which)
    path = "/v1/detect" if which == "detector" else "/v1/completions"
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {service.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {500 << 20}\r\n\r\n").encode()
    start = time.monotonic()
    status, body, _ = _raw(service.url, head + b'{"text": "')
    assert status == 413 and body["error"]["code"] == "too_large", body
    assert body["error"]["details"][0]["deprecated_code"] == "request_entity_too_large"  # for one release
    assert time.monotonic() - start < 5.0


def test_a_chunked_body_is_refused_with_a_json_411(detector):
    chunk = '{"text": "abcde"}'
    request = (f"POST /v1/detect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {detector.token}\r\n"
               "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
               f"{len(chunk):x}\r\n{chunk}\r\n0\r\n\r\n").encode()
    status, body, _ = _raw(detector.url, request)
    assert status == 411, body


def test_a_huge_chunked_body_is_not_buffered(detector):
    """No Content-Length: the server stops reading past the body limit and answers a JSON 4xx; no
    worker grows by more than 50 MB (a worker that buffered the 64 MB offered would)."""
    before = _worker_rss_mb(detector)
    host, port = detector.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall((f"POST /v1/detect HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {detector.token}\r\n"
                      "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        chunk = b"a" * (1 << 20)
        try:
            for _ in range(64):  # 64 MB offered; the limit is under 1 MB
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        except OSError:
            pass  # the server answered and closed: what we want
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
    after = _worker_rss_mb(detector)
    assert all(after[pid] - before.get(pid, after[pid]) < 50 for pid in after), (before, after)


def _worker_rss_mb(service: Service) -> dict[int, float]:
    """Resident memory of each process in the service's process group (master and workers), in MB."""
    out = subprocess.run(["ps", "-o", "pid=,rss=", "-g", str(service.process.pid)], capture_output=True, text=True)
    return {int(pid): int(rss) / 1024 for pid, rss in (line.split() for line in out.stdout.splitlines())}


@pytest.mark.parametrize("length,status", [(5000, 404), (9000, 414)])
def test_long_urls_get_json_errors(detector, length, status):
    got, body, _ = _raw(detector.url, f"GET /v1/verdicts/{'a' * length} HTTP/1.1\r\nHost: x\r\n"
                                      f"Authorization: Bearer {detector.token}\r\n\r\n".encode())
    assert got == status and set(body["error"]) >= {"code", "message"}, body


def test_oversized_headers_get_a_json_error(detector):
    got, body, _ = _raw(detector.url, f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {'b' * 9000}\r\n\r\n".encode())
    assert got in (400, 431) and "error" in body


def test_metrics_sum_over_the_workers(detector):
    def count() -> float:
        status, text, _ = call("GET", detector.url + "/metrics")
        assert status == 200
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("provmark_http_requests_total{") and 'route="/openapi.json"' in line)

    before = count()
    for _ in range(40):  # 2 workers: each scrape would see about half of these if it read one worker
        assert call("GET", detector.url + "/openapi.json")[0] == 200
    assert [count() for _ in range(4)] == [before + 40] * 4


def test_the_admin_token_is_in_its_0600_file_and_not_in_the_service_output(detector, generation, home):
    token_file = home / "admin.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    for service in (detector, generation):
        assert token not in service.output()
    assert str(token_file) in detector.output()  # the log says where it is
