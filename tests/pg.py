"""A throwaway PostgreSQL server for tests: ``initdb`` into a temp folder, ``pg_ctl start`` on a free
loopback port, one fresh database per test, stopped when the test session ends.

Use it as a plugin so every test module shares one server: ``pytest_plugins = ["pg"]``, then ask for
the ``postgresql_url`` fixture (a new, empty database) or ``database_url`` (parametrised by
``backend_url_params``: SQLite file and PostgreSQL). Without the server binaries the PostgreSQL tests
are skipped, except when ``CI=true``: there they fail, so CI never passes by skipping.
As root the server runs as the ``postgres`` system user (``initdb`` refuses root).
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

BIN_GLOBS = ("/usr/lib/postgresql/*/bin",)  # Debian/Ubuntu layout (apt-get install postgresql)
SERVER_USER = "postgres"
START_TIMEOUT_S = 60
BACKENDS = ("sqlite", "postgresql")


def find_bin_dir() -> Path | None:
    """The folder with initdb/pg_ctl: $PATH first, else the newest Debian-installed version."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    found = sorted(glob.glob(f"{BIN_GLOBS[0]}/pg_ctl"), key=lambda p: int(p.split("/")[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One running server; ``create_database()`` hands out fresh databases on it."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="provmark-pg-"))
        self.data_dir, self.socket_dir = self.root / "data", self.root / "sock"
        self.socket_dir.mkdir()
        self.port = _free_port()
        self._run_as = []
        if os.geteuid() == 0:  # initdb refuses root: hand the folder to the postgres user
            user = pwd.getpwnam(SERVER_USER)
            for path in (self.root, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            self._run_as = ["runuser", "-u", SERVER_USER, "--"]
        self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        options = (f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=50")
        self._run("pg_ctl", "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(self.data_dir),
                  "-l", str(self.root / "server.log"), "-o", options)
        self.running = True

    def _run(self, program: str, *args: str) -> None:
        command = [*self._run_as, str(self.bin_dir / program), *args]
        result = subprocess.run(command, check=False, capture_output=True, text=True,
                                timeout=START_TIMEOUT_S + 30)
        if result.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{program} failed: {result.stderr.strip()[-2000:]}\n{tail}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if self.running:
            self.running = False
            try:
                self._run("pg_ctl", "stop", "-m", "immediate", "-D", str(self.data_dir))
            finally:
                shutil.rmtree(self.root, ignore_errors=True)


_server: PostgresServer | None = None


def postgres_server() -> PostgresServer:
    """The session's server, started on first use (skips, or fails under CI=true, without binaries)."""
    global _server
    if _server is None:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            message = "PostgreSQL server binaries not found (apt-get install postgresql)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message + " and CI=true: PostgreSQL tests must not be skipped in CI")
            pytest.skip(message)
        _server = PostgresServer(bin_dir)
        atexit.register(_server.stop)  # also covers sessions that end without the fixture's teardown
    return _server


@pytest.fixture(scope="session")
def pg_server():
    server = postgres_server()
    yield server
    server.stop()


@pytest.fixture
def postgresql_url(pg_server) -> str:
    """SQLAlchemy URL of a fresh, empty PostgreSQL database."""
    return pg_server.create_database()


@pytest.fixture(params=BACKENDS)
def database_url(request, tmp_path) -> str:
    """A fresh empty database on each backend: a SQLite file in tmp_path, then PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return request.getfixturevalue("postgresql_url")
