"""Tamper evidence for what users read: a verdict or receipt row edited, deleted or
added by SQL is named by `provmark audit verify`, on SQLite and PostgreSQL, while an untouched
database verifies clean. Before this, a forged verdict was served and verify said the chain was intact.
"""

from __future__ import annotations

import json

import pytest
from identity_fixtures import signing_keys_for
from sqlalchemy import text

from api.cli import main
from db.audit import verify
from db.audit_rows import ROW_DELETED, ROW_EDITED, ROW_UNLOGGED
from db.caller import Caller
from db.receipts import issue_receipt
from db.store import Store
from db.verdicts import VerdictRecord

pytest_plugins = ["pg"]


def _record(z: float, verdict: str = "not_watermarked") -> VerdictRecord:
    return VerdictRecord(text_sha256="ab" * 32, verdict=verdict, z=z, p_value=0.4, green_count=30, scored_count=100,
                         green_fraction=0.3, spec="kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256",
                         spec_fingerprint="f" * 16, tokenizer_fingerprint="t" * 16, key_id="k-1",
                         options={"z_threshold": 4.0, "fpr": None, "big": 1e300, "keys": ["k-1"]},
                         windows=None, receipt_id=None)


@pytest.fixture
def filled(database_url, tmp_path, provmark_home):
    store = Store(url=database_url, home=tmp_path)
    store.upgrade()
    caller = Caller(name="tester")
    verdicts = [store.record_verdict(_record(0.1 * i), caller) for i in range(5)]
    signer = signing_keys_for(store, provmark_home).receipts
    receipts = [issue_receipt(store, signer, "tester", text_sha256="cd" * 32, token_count=3 + i,
                              model_id="m", key_id="k-1", spec_fingerprint="f" * 16)["receipt_id"] for i in range(3)]
    yield store, verdicts, receipts
    store.close()


def _sql(store: Store, statement: str, **params) -> None:
    with store.engine.begin() as connection:
        connection.execute(text(statement), params)


def _named(store: Store, problem: str, row_id: str) -> list:
    report = verify(store)
    return [p for p in report.problems if p.problem == problem and row_id in p.message], report


def test_an_untouched_database_verifies_clean(filled):
    store, verdicts, receipts = filled
    report = verify(store)
    assert report.ok, report.problems
    assert report.rows_checked == len(verdicts) + len(receipts) and report.rows_partly_covered == 0


@pytest.mark.parametrize("column,value", [("verdict", "'watermarked'"), ("z", "9.9"), ("p_value", "1e-12"),
                                          ("key_id", "'k-2'"), ("green_count", "99"), ("caller_name", "'someone'"),
                                          ("text_sha256", "'" + "cd" * 32 + "'")])
def test_an_edited_verdict_column_is_named(filled, column, value):
    store, verdicts, _ = filled
    _sql(store, f"UPDATE verdicts SET {column} = {value} WHERE id = :id", id=verdicts[2])
    named, report = _named(store, ROW_EDITED, verdicts[2])
    assert len(named) == 1 and len(report.problems) == 1, report.problems


def test_a_deleted_verdict_and_an_inserted_one_are_named(filled):
    store, verdicts, _ = filled
    _sql(store, "DELETE FROM verdicts WHERE id = :id", id=verdicts[0])
    _sql(store, "INSERT INTO verdicts (id, created_at, text_sha256, verdict, z, p_value, green_count, scored_count, "
                "green_fraction, spec, spec_fingerprint, tokenizer_fingerprint, key_id, options) SELECT "
                "'forged-verdict', created_at, text_sha256, 'watermarked', 12.0, p_value, green_count, scored_count, "
                "green_fraction, spec, spec_fingerprint, tokenizer_fingerprint, key_id, options FROM verdicts "
                "WHERE id = :id", id=verdicts[1])
    report = verify(store)
    assert {(p.problem, verdicts[0] in p.message or "forged-verdict" in p.message) for p in report.problems} == \
        {(ROW_DELETED, True), (ROW_UNLOGGED, True)}, report.problems


@pytest.mark.parametrize("column,value", [("token_count", "1000"), ("key_id", "'k-9'"), ("signature", "'AAAA'")])
def test_an_edited_receipt_is_named(filled, column, value):
    store, _, receipts = filled
    _sql(store, f"UPDATE receipts SET {column} = {value} WHERE receipt_id = :id", id=receipts[1])
    named, report = _named(store, ROW_EDITED, receipts[1])
    assert len(named) == 1 and len(report.problems) == 1, report.problems


def test_an_edited_audit_event_is_named(filled):
    store, verdicts, _ = filled
    _sql(store, "UPDATE audit_events SET details = :d WHERE subject_id = :id",
         d=json.dumps({"verdict": "watermarked", "z": 9.9}), id=verdicts[3])
    report = verify(store)
    assert any(p.problem == "edited" for p in report.problems), report.problems


def test_rows_from_before_row_digests_are_compared_on_the_fields_their_events_carried(filled):
    """An event written before row_sha256 existed (rewritten here with the chain recomputed, as an
    old database would hold it, and its transparency-log leaf hash as revision 0007 computes it): its row
    is checked on verdict/z/key/spec, and counted as partly covered."""
    from db.audit import GENESIS_HASH, event_hash, log_entry
    from db.rows import iso_utc
    from provenance.merkle import leaf_hash

    store, verdicts, _ = filled
    with store.engine.begin() as connection:
        rows = connection.execute(text("SELECT seq, event_id, kind, actor, subject_id, created_at, details "
                                       "FROM audit_events ORDER BY seq")).all()
        previous = GENESIS_HASH
        for seq, event_id, kind, actor, subject_id, created_at, details in rows:
            details = json.loads(details)
            details.pop("row_sha256", None)
            from db.rows import AuditEventRow  # the ORM type reads created_at back as UTC

            stamp = connection.execute(
                AuditEventRow.__table__.select().where(AuditEventRow.seq == seq)).first().created_at
            digest = event_hash(previous, event_id, kind, actor, subject_id, iso_utc(stamp), details)
            leaf = leaf_hash(log_entry(seq, event_id, kind, subject_id, iso_utc(stamp), details, digest)).hex()
            connection.execute(text("UPDATE audit_events SET details = :d, prev_hash = :p, hash = :h, leaf_hash = :l "
                                    "WHERE seq = :s"),
                               {"d": json.dumps(details, sort_keys=True, separators=(",", ":")), "p": previous,
                                "h": digest, "l": leaf, "s": seq})
            previous = digest
        connection.execute(text("UPDATE audit_head SET hash = :h"), {"h": previous})
    report = verify(store)
    assert report.ok and report.rows_partly_covered == report.rows_checked > 0, report.problems
    _sql(store, "UPDATE verdicts SET z = 9.9 WHERE id = :id", id=verdicts[4])
    named, report = _named(store, ROW_EDITED, verdicts[4])
    assert len(named) == 1, report.problems


def test_the_cli_exits_1_and_names_the_row(filled, capsys, monkeypatch, database_url):
    store, verdicts, _ = filled
    monkeypatch.setenv("PROVMARK_DATABASE_URL", database_url)
    assert main(["audit", "verify"]) == 0
    _sql(store, "UPDATE verdicts SET verdict = 'watermarked', z = 9.9 WHERE id = :id", id=verdicts[1])
    capsys.readouterr()
    assert main(["audit", "verify"]) == 1
    out = capsys.readouterr().out
    assert "row_edited" in out and verdicts[1] in out
