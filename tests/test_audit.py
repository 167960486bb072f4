"""The audit hash chain on SQLite and PostgreSQL: concurrent appends, tamper detection, the CLI."""

import hashlib
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import bindparam, text

from api.cli import main
from db.audit import GENESIS_HASH, AuditError, append_event, list_events, verify
from db.audit_report import DELETED, EDITED, REORDERED
from db.rows import UTCDateTime
from db.store import Store

pytest_plugins = ["pg"]

REPO = Path(__file__).resolve().parent.parent
WORKERS, APPENDS_PER_WORKER = 4, 25
EVENTS = 10

# Each worker waits for the "go" file so all four append at the same time.
WORKER_SCRIPT = """
import sys, time
from pathlib import Path
from db.audit import append_event
from db.store import Store
url, name, folder, count = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
store = Store(url=url)
(folder / f"ready-{name}").touch()
while not (folder / "go").exists():
    time.sleep(0.005)
for i in range(count):
    with store.write() as session:
        append_event(session, "detection", name, f"{name}-{i}", {"i": i})
store.close()
"""


@pytest.fixture
def store(database_url):
    store = Store(url=database_url)
    store.upgrade()
    yield store
    store.close()


@pytest.fixture
def chain(store):
    """A store with EVENTS events, each appended in its own transaction."""
    for i in range(EVENTS):
        with store.write() as session:
            append_event(session, "detection", "tester", f"v-{i}", {"i": i, "z": i / 2})
    return store


def test_concurrent_processes_build_one_contiguous_chain(store, tmp_path):
    url = store.url.render_as_string(hide_password=False)
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, url, f"worker-{w}", str(tmp_path),
                          str(APPENDS_PER_WORKER)], cwd=REPO)
        for w in range(WORKERS)
    ]
    while len(list(tmp_path.glob("ready-*"))) < WORKERS and all(w.poll() is None for w in workers):
        time.sleep(0.01)
    (tmp_path / "go").touch()
    reports = []
    while any(w.poll() is None for w in workers):  # verifying while others append sees a sound prefix
        reports.append(verify(store))
    assert all(report.ok for report in reports), [r.problems for r in reports if not r.ok][:1]
    assert [w.wait(timeout=120) for w in workers] == [0] * WORKERS
    events = list_events(store, limit=1000)
    assert [e.seq for e in events] == list(range(1, WORKERS * APPENDS_PER_WORKER + 1))
    for w in range(WORKERS):
        mine = [e.details["i"] for e in events if e.actor == f"worker-{w}"]
        assert mine == list(range(APPENDS_PER_WORKER))  # each worker's events in its own order
    report = verify(store)
    assert report.ok and report.events == WORKERS * APPENDS_PER_WORKER
    assert report.head_hash == events[-1].hash


def test_hash_is_sha256_of_documented_canonical_json(chain):
    first = list_events(chain, limit=1)[0]
    document = {"prev_hash": GENESIS_HASH, "event_id": first.event_id, "kind": "detection", "actor": "tester",
                "subject_id": "v-0", "created_at": first.created_at, "details": {"i": 0, "z": 0.0}}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert first.hash == hashlib.sha256(canonical).hexdigest()
    assert GENESIS_HASH == hashlib.sha256(b"provmark/audit/genesis").hexdigest()


def _ids(store) -> dict[int, str]:
    return {e.seq: e.event_id for e in list_events(store, limit=1000)}


def _tamper(store, statements: list[str], **params) -> None:
    with store.engine.begin() as connection:
        for statement in statements:
            clause = text(statement)
            if "when" in params:
                clause = clause.bindparams(bindparam("when", type_=UTCDateTime()))
            connection.execute(clause, params)


TAMPERING = {
    "details": (["UPDATE audit_events SET details = :d WHERE seq = 5"], {"d": '{"i":4,"z":99.0}'}, 5, EDITED),
    "hash": (["UPDATE audit_events SET hash = :h WHERE seq = 5"], {"h": "0" * 64}, 5, EDITED),
    "time": (["UPDATE audit_events SET created_at = :when WHERE seq = 5"],
             {"when": datetime(2020, 1, 1, tzinfo=UTC)}, 5, EDITED),
    "actor": (["UPDATE audit_events SET actor = 'someone-else' WHERE seq = 5"], {}, 5, EDITED),
    "delete_middle": (["DELETE FROM audit_events WHERE seq = 5"], {}, 5, DELETED),
    "delete_last": ([f"DELETE FROM audit_events WHERE seq = {EVENTS}"], {}, EVENTS, DELETED),
    "swap": (["UPDATE audit_events SET seq = -1 WHERE seq = 3",
              "UPDATE audit_events SET seq = 3 WHERE seq = 7",
              "UPDATE audit_events SET seq = 7 WHERE seq = -1"], {}, 3, REORDERED),
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_tampering_is_found_and_named(chain, how):
    statements, params, seq, problem = TAMPERING[how]
    ids_before = _ids(chain)
    assert verify(chain).ok
    _tamper(chain, statements, **params)
    report = verify(chain)
    assert not report.ok
    first = report.problems[0]
    assert (first.seq, first.problem) == (seq, problem)
    if problem == EDITED:
        assert first.event_id == ids_before[seq] and ids_before[seq] in first.message
    if problem == REORDERED:  # the event now at seq 3 came from seq 7, and vice versa
        assert first.event_id == ids_before[7]
        assert {(p.seq, p.event_id) for p in report.problems} == {(3, ids_before[7]), (7, ids_before[3])}
    if how == "delete_middle":
        assert report.problems == [report.problems[0]] and "event 5 is missing" in first.message


def test_failed_transaction_leaves_no_event_and_keeps_the_head(chain):
    head_before = verify(chain).head_hash
    with pytest.raises(RuntimeError), chain.write() as session:
        append_event(session, "detection", "tester", "v-x", {"i": -1})
        raise RuntimeError("the verdict could not be written")
    report = verify(chain)
    assert report.ok and report.events == EVENTS and report.head_hash == head_before


@pytest.mark.parametrize(
    ("kind", "details"),
    [("deletion", {}), ("token.create", {"token": "pmk_x"}), ("detection", {"text": "hi"}),
     ("detection", {"z": float("nan")}), ("detection", {"when": datetime.now()})],
)
def test_append_rejects_bad_kinds_and_secret_details(store, kind, details):
    with pytest.raises(AuditError), store.write() as session:
        append_event(session, kind, "tester", None, details)
    assert verify(store).events == 0


def test_cli_verify_reports_ok_then_tampering(chain, monkeypatch, capsys):
    monkeypatch.setenv("PROVMARK_DATABASE_URL", chain.url.render_as_string(hide_password=False))
    assert main(["audit", "verify"]) == 0
    assert f"audit chain OK: {EVENTS} events" in capsys.readouterr().out
    _tamper(chain, ["DELETE FROM audit_events WHERE seq = 2"])
    assert main(["audit", "verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["problems"][0]["seq"] == 2
    assert report["problems"][0]["problem"] == DELETED
