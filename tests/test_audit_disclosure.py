"""The ``audit`` scope reads the trail at the ``detect`` scope's precision.

A token that may both detect and audit (or one person holding two tokens) would otherwise get the exact
oracle back: submit a text, read its stored row's exact G and T, or bisect its exact z with the ``min_z``
filter, or test guesses of G against the row's digest in its ``detection`` audit event. Only a token that
also holds ``explain`` (trusted with colours) reads exact numbers; the others see the verdict and the
coarse, dithered z the detect scope shows, and filter on those.
"""

import csv
import io
import json
import urllib.parse

import pytest
from http_fixtures import call, human_text, make_token, serve, shared_vocabulary, watermarked_text
from sqlalchemy import text as sql

from api.detector.app import create_app, services_of
from db.migrations import alembic_config, head_revision
from db.store import Store
from db.verdicts import VerdictFilter
from watermark.keys import Keyring

pytest_plugins = ["pg"]

KEY = "k-audit"
EXACT_FIELDS = ("green_count", "scored_count", "green_fraction")
EXACT_OPTIONS = ("null", "statistic", "spoof_check", "own_output", "public_half")


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create(KEY)
    return ring


def _detect(base_url, token, text, **options):
    status, body, _ = call("POST", base_url + "/v1/detect", {"text": text, **options}, token=token)
    assert status == 200, body
    return body


def _get(base_url, path, token):
    status, body, _ = call("GET", base_url + path, token=token)
    assert status == 200, body
    return body


def test_the_audit_scope_sees_what_detect_shows_and_filters_on_it(database_url, provmark_home, keyring):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(), "database_url": database_url})
    store = services_of(app).store
    prober = make_token(store, "detect", "audit")  # the attacker: may detect and read the trail
    trusted = make_token(store, "detect", "audit", "explain")
    human = human_text(1500)
    marked = watermarked_text(shared_vocabulary(), keyring.secret(KEY), human)
    with serve(app) as base_url:
        shown = {name: _detect(base_url, prober, text, windows=True)
                 for name, text in (("marked", marked), ("human", human), ("short", human[:80]))}
        for name, body in shown.items():
            row = _get(base_url, f"/v1/verdicts/{body['id']}", prober)
            exact = _get(base_url, f"/v1/verdicts/{body['id']}", trusted)
            # the prober reads exactly what it was shown, and nothing a colour can be recovered from
            assert row["disclosure"] == "coarse-dithered/v1" and exact["disclosure"] == "exact", name
            assert (row["verdict"], row["z"], row["p_value"]) == (body["verdict"], body["z_score"], body["p_value"])
            assert all(row[field] is None for field in EXACT_FIELDS), (name, row)
            assert not set(EXACT_OPTIONS) & row["options"].keys(), (name, row["options"])
            assert row["windows"] == body["windows"] and row["key_id"] == body["key_id"]
            assert row["options"]["keys_tested"] == [KEY] and row["options"]["windows"] is True
            # a token trusted with colours still reads the exact row
            assert exact["green_count"] is not None and exact["options"]["null"] is not None, name
        assert shown["short"]["verdict"] == "insufficient_text" and shown["short"]["z_score"] is None
        exact_short = _get(base_url, f"/v1/verdicts/{shown['short']['id']}", trusted)
        assert exact_short["scored_count"] >= 1  # a unit was scored: its colour is in the exact row only

        # min_z between the shown and the exact z: the prober's filter sees the shown z, not the exact one
        exact_marked = _get(base_url, f"/v1/verdicts/{shown['marked']['id']}", trusted)
        assert exact_marked["z"] > shown["marked"]["z_score"] > 4.0
        between = (exact_marked["z"] + shown["marked"]["z_score"]) / 2
        query = "/v1/verdicts?" + urllib.parse.urlencode({"min_z": between})
        assert [item["id"] for item in _get(base_url, query, prober)["items"]] == []
        assert [item["id"] for item in _get(base_url, query, trusted)["items"]] == [shown["marked"]["id"]]
        # the verdict filter takes the shown verdict
        listed = _get(base_url, "/v1/verdicts?verdict=insufficient_text", prober)["items"]
        assert [item["id"] for item in listed] == [shown["short"]["id"]]
        assert all(item["green_count"] is None for item in _get(base_url, "/v1/verdicts", prober)["items"])
        # the key filter finds only what the view names a key for (the best key of a negative is not shown)
        keyed = _get(base_url, f"/v1/verdicts?key_id={KEY}", prober)["items"]
        assert [item["id"] for item in keyed] == [shown["marked"]["id"]]
        assert len(_get(base_url, f"/v1/verdicts?key_id={KEY}", trusted)["items"]) >= 2

        # CSV: the same view
        status, body, _ = call("GET", base_url + "/v1/verdicts?format=csv", token=prober)
        assert status == 200
        rows = list(csv.DictReader(io.StringIO(body)))
        assert len(rows) == 3 and all(row[field] == "" for row in rows for field in EXACT_FIELDS)
        assert not any(set(EXACT_OPTIONS) & json.loads(row["options"]).keys() for row in rows)

        # audit events: no exact z, and no digest a guess of G could be checked against
        events = _get(base_url, "/v1/audit?kind=detection", prober)["items"]
        assert [e["subject_id"] for e in events] == [body["id"] for body in shown.values()]
        for event in events:
            assert not {"z", "verdict", "row_sha256", "key_id"} & event["details"].keys(), event
            assert event["hash"] is None and event["prev_hash"] is None
        every = _get(base_url, "/v1/audit", prober)["items"]
        assert all(e["hash"] is None for e in every)  # the next event's prev_hash is this one's hash
        full = _get(base_url, "/v1/audit?kind=detection", trusted)["items"]
        assert all(e["details"]["row_sha256"] and e["hash"] for e in full)
        report = _get(base_url, "/v1/audit/verify", prober)
        assert report["ok"] is True and report["head_hash"] is None  # checked by the server; the head is a hash too
        assert len(_get(base_url, "/v1/audit/verify", trusted)["head_hash"]) == 64
    # the shown columns are outside the row digest, so verify checks them against the options it covers
    from db.audit import verify

    with store.write_engine.begin() as connection:
        connection.execute(sql("UPDATE verdicts SET shown_verdict = 'watermarked' WHERE id = :id"),
                           {"id": shown["short"]["id"]})
    report = verify(store)
    assert not report.ok and [p.problem for p in report.problems] == ["row_edited"]
    assert shown["short"]["id"] in report.problems[0].message
    store.close()


def test_rows_written_before_the_shown_columns_keep_what_their_caller_saw(database_url):
    """Revision 0006 adds the shown verdict and z: a row whose caller was shown the coarse view keeps it, an
    insufficient text stays one, and a row whose shown view was never recorded is withheld from the audit
    scope, never shown exactly. The columns are copies of what the row's options recorded, so no row digest
    changes."""
    from alembic import command

    store = Store(url=database_url)
    config = alembic_config()
    with store.write_engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0005_output_grams")
    disclosed = {"disclosure": "coarse-dithered/v1", "verdict": "watermarked", "z_score": 5.25, "p_value": 7.6e-8}
    rows = [("a" * 36, "watermarked", 6.1, {"disclosed": disclosed}),
            ("b" * 36, "insufficient_text", 0.0, {}),
            ("c" * 36, "not_watermarked", 1.7, {})]
    with store.write_engine.begin() as connection:
        for row_id, verdict, z, options in rows:
            connection.execute(sql(
                "INSERT INTO verdicts (id, created_at, text_sha256, verdict, z, p_value, green_count, scored_count, "
                "green_fraction, spec, spec_fingerprint, tokenizer_fingerprint, key_id, options, windows) VALUES "
                "(:id, CURRENT_TIMESTAMP, :sha, :verdict, :z, 0.01, 3, 9, 0.33, 's', 'f', 't', 'k', :options, NULL)"),
                {"id": row_id, "sha": "0" * 64, "verdict": verdict, "z": z, "options": json.dumps(options)})
    assert store.upgrade() == head_revision()
    seen = {item["id"]: item for item in store.list_verdicts(exact=False).items}
    assert (seen["a" * 36]["verdict"], seen["a" * 36]["z"]) == ("watermarked", 5.25)
    assert (seen["b" * 36]["verdict"], seen["b" * 36]["z"]) == ("insufficient_text", None)
    assert seen["c" * 36]["verdict"] is None and seen["c" * 36]["disclosure"] == "withheld"
    assert all(item["green_count"] is None for item in seen.values())
    assert [item["id"] for item in store.list_verdicts(VerdictFilter(min_z=5.0), exact=False).items] == ["a" * 36]
    assert store.get_verdict("c" * 36)["z"] == 1.7  # the exact row is untouched
    from db.audit_rows import row_digest
    from db.rows import VerdictRow

    with store.read() as session:  # the digest covers the columns its events named, and they did not change
        row = session.get(VerdictRow, "a" * 36)
        assert row.shown_z == 5.25 and row_digest(row) == _digest_before(row)
    store.close()


def _digest_before(row) -> str:
    """The digest as revision 0005's service computed it (no shown columns)."""
    import hashlib

    from db.audit_rows import _plain

    columns = ("id", "created_at", "text_sha256", "verdict", "z", "p_value", "green_count", "scored_count",
               "green_fraction", "spec", "spec_fingerprint", "tokenizer_fingerprint", "key_id", "options",
               "windows", "receipt_id", "caller_token_id", "caller_name")
    document = {name: _plain(getattr(row, name)) for name in columns}
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                          .encode()).hexdigest()
