"""The store on SQLite and a real PostgreSQL: migrations, verdicts, pagination, durability, outages."""

import csv
import io
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, inspect, select, text

from api.cli import main
from db import audit as audit_module
from db import verdicts as verdicts_module
from db.audit import verify
from db.caller import Caller
from db.migrations import current_revision, head_revision
from db.rows import AuditEventRow, VerdictRow, text_sha256
from db.store import Store, StoreUnavailable
from db.store import (
    database_url as default_database_url,
)
from db.verdicts import VerdictFilter, VerdictRecord, decode_cursor
from watermark.key_info import KeyInfo

pytest_plugins = ["pg"]

REPO = Path(__file__).resolve().parent.parent

TABLES = {"verdicts", "receipts", "audit_events", "audit_head", "api_tokens", "watermark_keys", "detection_usage",
          "output_units", "key_outputs", "tree_heads",
          "alembic_version"}
CALLER = Caller(name="ci-bot", token_id="tok-1")


def make_record(text_value: str = "hello", **changes) -> VerdictRecord:
    return VerdictRecord(**{
        "text_sha256": text_sha256(text_value), "verdict": "watermarked", "z": 5.5, "p_value": 1.9e-8,
        "green_count": 80, "scored_count": 100, "green_fraction": 0.8,
        "spec": "lefthash:h=1,gamma=0.25,delta=2.0", "spec_fingerprint": "ab" * 8,
        "tokenizer_fingerprint": "cd" * 8, "key_id": "k-main",
        "options": {"windows": True}, "windows": {"best": {"start": 0, "z": 5.5}}, **changes,
    })


@pytest.fixture
def store(database_url):
    store = Store(url=database_url)
    store.upgrade()
    yield store
    store.close()


def test_migrations_bring_an_empty_database_to_head_and_are_idempotent(database_url):
    store = Store(url=database_url)
    assert current_revision(store.engine) is None
    assert store.upgrade() == head_revision()
    assert store.upgrade() == head_revision()  # second run: nothing to do
    assert TABLES <= set(inspect(store.engine).get_table_names())
    with store.read() as session:
        assert session.scalar(text("SELECT seq FROM audit_head WHERE id = 1")) == 0
    store.close()


def test_workers_starting_together_migrate_once(database_url):
    script = "import sys; from db.store import Store; print(Store(url=sys.argv[1]).upgrade())"
    workers = [subprocess.Popen([sys.executable, "-c", script, database_url], cwd=REPO, stdout=subprocess.PIPE,
                                text=True) for _ in range(3)]
    outputs = [worker.communicate(timeout=120)[0].strip() for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0]
    assert outputs == [head_revision()] * 3
    store = Store(url=database_url)
    with store.read() as session:  # the genesis row was inserted exactly once
        assert session.scalar(text("SELECT count(*) FROM audit_head")) == 1
    store.close()


def test_migration_genesis_matches_audit_module(store):
    with store.read() as session:
        assert session.scalar(text("SELECT hash FROM audit_head WHERE id = 1")) == audit_module.GENESIS_HASH


def test_verdict_round_trip_keeps_hash_not_text(store):
    verdict_id = store.record_verdict(make_record("secret draft"), CALLER, text="secret draft")
    stored = store.get_verdict(verdict_id)
    assert stored["text"] is None
    assert stored["text_sha256"] == text_sha256("secret draft")
    assert stored["caller_token_id"] == "tok-1" and stored["caller_name"] == "ci-bot"
    assert stored["options"] == {"windows": True} and stored["windows"] == {"best": {"start": 0, "z": 5.5}}
    assert (stored["z"], stored["green_count"], stored["scored_count"]) == (5.5, 80, 100)
    assert stored["created_at"].endswith("Z")
    assert store.get_verdict("no-such-id") is None


def test_retention_keeps_text_and_checks_its_hash(database_url):
    store = Store(url=database_url, retain_text=True)
    store.upgrade()
    verdict_id = store.record_verdict(make_record("keep me"), CALLER, text="keep me")
    assert store.get_verdict(verdict_id)["text"] == "keep me"
    with pytest.raises(ValueError, match="text does not match"):
        store.record_verdict(make_record("keep me"), CALLER, text="something else")
    store.close()


def test_retention_switch_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PROVMARK_RETAIN_TEXT", "1")
    assert Store(url=f"sqlite:///{tmp_path / 'a.db'}").retain_text
    monkeypatch.setenv("PROVMARK_RETAIN_TEXT", "0")
    assert not Store(url=f"sqlite:///{tmp_path / 'a.db'}").retain_text


def test_verdict_and_its_audit_event_are_written_together(store):
    verdict_id = store.record_verdict(make_record(), CALLER)
    events = audit_module.list_events(store)
    assert [(e.kind, e.subject_id, e.actor) for e in events] == [("detection", verdict_id, "token:tok-1")]
    assert "text" not in events[0].details and events[0].details["verdict"] == "watermarked"


def test_failed_audit_append_leaves_no_verdict(store, monkeypatch):
    def broken_append(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(audit_module, "append_event", broken_append)
    with pytest.raises(RuntimeError):
        store.record_verdict(make_record(), CALLER)
    with store.read() as session:
        assert session.scalar(select(func.count()).select_from(VerdictRow)) == 0
        assert session.scalar(select(func.count()).select_from(AuditEventRow)) == 0


def test_failed_verdict_insert_leaves_no_audit_event(store, monkeypatch):
    monkeypatch.setattr(verdicts_module, "new_id", lambda: "fixed-id")
    store.record_verdict(make_record(), CALLER)
    with pytest.raises(Exception) as raised:
        store.record_verdict(make_record(), CALLER)  # same primary key: the insert fails
    assert "IntegrityError" in type(raised.value).__name__
    assert [e.seq for e in audit_module.list_events(store)] == [1]
    assert verify(store).ok


def _insert_at(store, moments):
    """Verdict rows with chosen times (ties included) straight into the table."""
    with store.write() as session:
        for i, moment in enumerate(moments):
            record = make_record(f"text {i}", z=float(i), verdict=("watermarked", "not_watermarked")[i % 2],
                                 key_id=("k-a", "k-b")[i % 3 == 0])
            fields = {name: getattr(record, name) for name in VerdictRecord.__dataclass_fields__}
            session.add(VerdictRow(id=f"v-{i:03d}", created_at=moment, caller_name="seed", **fields))


BASE_TIME = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def test_cursor_pagination_is_complete_ordered_and_stable(store):
    # 25 rows on 10 distinct times: ties are broken by id.
    _insert_at(store, [BASE_TIME + timedelta(seconds=i // 3) for i in range(25)])
    seen, cursor = [], None
    while True:
        page = store.list_verdicts(cursor=cursor, limit=7)
        seen.extend(item["id"] for item in page.items)
        if len(seen) == 7:  # a newer verdict arriving mid-way must not shift later pages
            store.record_verdict(make_record("late"), CALLER)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    expected = sorted((f"v-{i:03d}" for i in range(25)), key=lambda v: (int(v[2:]) // 3, v), reverse=True)
    assert seen == expected


def test_list_filters(store):
    _insert_at(store, [BASE_TIME + timedelta(minutes=i) for i in range(12)])
    def ids(**kw) -> set[str]:
        return {item["id"] for item in store.list_verdicts(VerdictFilter(**kw)).items}

    assert ids(verdict="not_watermarked") == {f"v-{i:03d}" for i in range(1, 12, 2)}
    assert ids(key_id="k-b") == {f"v-{i:03d}" for i in range(0, 12, 3)}
    assert ids(min_z=10.0) == {"v-010", "v-011"}
    assert ids(text_sha256=text_sha256("text 4")) == {"v-004"}
    window = ids(since=BASE_TIME + timedelta(minutes=2), until=BASE_TIME + timedelta(minutes=5))
    assert window == {"v-002", "v-003", "v-004"}  # since inclusive, until exclusive
    with pytest.raises(ValueError, match="limit"):
        store.list_verdicts(limit=0)
    with pytest.raises(ValueError, match="cursor"):
        store.list_verdicts(cursor="not-a-cursor")


def test_csv_export_has_every_row_and_defuses_formulas(store):
    _insert_at(store, [BASE_TIME + timedelta(seconds=i) for i in range(5)])
    store.record_verdict(make_record("x"), Caller(name="=HYPERLINK(1)"))
    rows = list(csv.DictReader(io.StringIO("".join(store.verdicts_csv(limit=2)))))
    assert len(rows) == 6
    assert rows[0]["caller_name"] == "'=HYPERLINK(1)"
    assert {row["id"] for row in rows[1:]} == {f"v-{i:03d}" for i in range(5)}


def test_key_metadata_has_no_secret_and_is_audited(store):
    info = KeyInfo("k-main", "active", "2025-01-01T00:00:00Z", None, "0123456789abcdef")
    store.record_key_event(info, "create", "cli")
    rotated = KeyInfo("k-main", "rotated", info.created_at, None, info.fingerprint)
    store.record_key_event(rotated, "rotate", "cli")
    assert store.list_key_records() == [{"key_id": "k-main", "status": "rotated",
                                         "fingerprint": "0123456789abcdef",
                                         "created_at": "2025-01-01T00:00:00Z", "retired_at": None}]
    assert [e.kind for e in audit_module.list_events(store)] == ["key.create", "key.rotate"]


@pytest.mark.parametrize(
    ("change", "field_name"),
    [({"text_sha256": "ABC"}, "text_sha256"), ({"verdict": "maybe"}, "verdict"),
     ({"green_count": -1}, "green_count"), ({"z": float("nan")}, "z"), ({"p_value": 2.0}, "p_value"),
     ({"spec": ""}, "spec")],
)
def test_verdict_record_validation_names_the_field(change, field_name):
    with pytest.raises(ValueError, match=field_name):
        make_record(**change)


def test_unreachable_postgres_is_store_unavailable_without_password():
    with socket_port_closed() as port:
        store = Store(url=f"postgresql+psycopg://app:hunter2@127.0.0.1:{port}/provmark")
        with pytest.raises(StoreUnavailable) as raised:
            store.get_verdict("x")
        assert "hunter2" not in str(raised.value) and "***" in str(raised.value)
        with pytest.raises(StoreUnavailable):
            store.upgrade()


def test_unopenable_sqlite_is_store_unavailable(tmp_path):
    store = Store(url=f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    with pytest.raises(StoreUnavailable):
        store.record_verdict(make_record(), CALLER)


def test_default_database_is_sqlite_in_home_with_wal(provmark_home, monkeypatch):
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    assert default_database_url() == f"sqlite:///{provmark_home / 'provmark.db'}"
    store = Store()
    store.upgrade()
    for suffix in ("", "-wal", "-shm"):  # verdicts are private: mode 0600 like the keyring
        assert (provmark_home / f"provmark.db{suffix}").stat().st_mode & 0o777 == 0o600
    with store.read() as session:
        assert session.scalar(text("PRAGMA journal_mode")) == "wal"
        assert session.scalar(text("PRAGMA busy_timeout")) >= 1000
    store.close()
    monkeypatch.setenv("PROVMARK_DATABASE_URL", "postgresql+psycopg://u@db.example/provmark")
    assert default_database_url() == "postgresql+psycopg://u@db.example/provmark"


def test_cli_db_upgrade_on_fresh_home_is_idempotent(provmark_home, monkeypatch, capsys):
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    assert main(["db", "upgrade"]) == 0
    assert main(["db", "upgrade"]) == 0
    assert head_revision() in capsys.readouterr().out
    with sqlite3.connect(provmark_home / "provmark.db") as connection:
        names = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert TABLES <= names


def test_decode_cursor_round_trip():
    page_cursor = verdicts_module.encode_cursor(BASE_TIME, "v-001")
    assert decode_cursor(page_cursor) == (BASE_TIME, "v-001")


class socket_port_closed:
    """A loopback port nobody listens on (bound then released)."""

    def __enter__(self):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    def __exit__(self, *exc):
        return False
