"""The detector service over real HTTP (werkzeug on a loopback port): detection, verdicts, audit,
auth and scopes, limits, provenance, errors, and a database that is down or goes away."""

import csv
import io
import os
import stat
import subprocess
import time

import pytest
from http_fixtures import (
    call,
    human_text,
    make_token,
    serve,
    shared_vocabulary,
    watermarked_text,
)
from identity_fixtures import signing_keys_for
from sqlalchemy import func, select

from api.detector.app import create_app, services_of
from db.receipts import issue_receipt
from db.rows import AuditEventRow, VerdictRow, text_sha256
from watermark.keys import Keyring

pytest_plugins = ["pg"]

KEY = "k-test"
ZERO_WIDTH_SPACE = "\u200b"


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create(KEY)
    return ring


def make_app(provmark_home, **config):
    return create_app({"home": provmark_home, "vocab": shared_vocabulary(), **config})


@pytest.fixture
def service(provmark_home, keyring):
    """(base_url, store, admin token) of a running detector service on SQLite."""
    app = make_app(provmark_home)
    store = services_of(app).store
    admin = (provmark_home / "admin.token").read_text().strip()
    with serve(app) as base_url:
        yield base_url, store, admin
    store.close()


@pytest.fixture(scope="module")
def texts():
    """(human, watermarked) texts; the watermarked one is rebuilt per key in ``marked``."""
    return human_text(1500)


def marked(keyring, source: str) -> str:
    return watermarked_text(shared_vocabulary(), keyring.secret(KEY), source)


def detect(base_url, token, text, **options):
    return call("POST", base_url + "/v1/detect", {"text": text, **options}, token=token)


# ---- detection, storage, audit -------------------------------------------------------------------

def test_detect_stores_the_verdict_with_its_audit_event(database_url, provmark_home, keyring, texts):
    app = make_app(provmark_home, database_url=database_url)
    store = services_of(app).store
    token = make_token(store, "detect")
    auditor = make_token(store, "audit", "explain")  # reads rows whole (audit alone: tests/test_audit_disclosure.py)
    watermarked = marked(keyring, texts)
    with serve(app) as base_url:
        status, body, _ = detect(base_url, token, watermarked, windows=True)
        assert status == 200
        assert body["verdict"] == "watermarked" and body["z_score"] > 4.0 and body["key_id"] == KEY
        assert body["text_sha256"] == text_sha256(watermarked) and body["provenance"] is None
        # the spec's fingerprint is named as stored verdicts and receipts name it; `fingerprint` stays one release
        assert body["spec_fingerprint"] == body["fingerprint"] and len(body["spec_fingerprint"]) > 0
        assert body.get("explanation") is None  # never sent unless asked (and allowed)
        # a detect token sees a coarse z, never above the exact one; the row keeps the exact numbers
        assert "num_tokens_scored" not in body and body["disclosure"]
        status, stored, _ = call("GET", f"{base_url}/v1/verdicts/{body['id']}", token=auditor)
        assert status == 200
        assert stored["verdict"] == "watermarked" and stored["z"] >= body["z_score"]
        assert stored["options"]["disclosed"]["z_score"] == body["z_score"]
        assert stored["spec_fingerprint"] == body["spec_fingerprint"]
        assert stored["scored_count"] > 0 and stored["green_count"] > 0 and stored["text"] is None
        assert stored["options"]["windows"] is True and stored["options"]["keys_tested"] == [KEY]
        assert stored["windows"]["detected"] is True

        status, human, _ = detect(base_url, token, texts)
        assert status == 200 and human["verdict"] == "not_watermarked" and human["z_score"] < 4.0

        status, events, _ = call("GET", f"{base_url}/v1/audit?kind=detection", token=auditor)
        assert status == 200
        assert [e["subject_id"] for e in events["items"]] == [body["id"], human["id"]]
        assert events["items"][0]["details"]["verdict"] == "watermarked"
        status, report, _ = call("GET", base_url + "/v1/audit/verify", token=auditor)
        assert status == 200 and report["ok"] is True and report["events"] >= 4
    store.close()


def test_empty_text_is_insufficient_and_still_stored(service):
    base_url, store, admin = service
    status, body, _ = detect(base_url, admin, "")
    assert status == 200 and body["verdict"] == "insufficient_text" and body["z_score"] is None
    assert store.get_verdict(body["id"])["verdict"] == "insufficient_text"


def test_forced_positions_are_left_out_of_scoring(service, keyring, texts):
    """A constrained generator's forced positions (fewer than two allowed tokens) carry no watermark:
    with all of them given, nothing is scored and the verdict is insufficient_text, not a guess."""
    base_url, _, admin = service
    text = marked(keyring, texts)
    status, full, _ = detect(base_url, admin, text)
    assert status == 200 and full["verdict"] == "watermarked" and full["num_forced_positions"] == 0
    everything = list(range(full["num_tokens"]))
    status, body, _ = detect(base_url, admin, text, forced_positions=everything)
    assert status == 200 and body["verdict"] == "insufficient_text"
    assert body["num_tokens_scored"] == 0 and body["num_forced_positions"] > 0
    status, body, _ = detect(base_url, admin, text, forced_positions=[-1])
    assert status == 422 and body["error"]["details"][0]["field"].startswith("forced_positions")


def test_explain_needs_the_explain_scope(service, keyring, texts):
    base_url, store, _ = service
    detect_only = make_token(store, "detect")
    explainer = make_token(store, "detect", "explain")
    text = marked(keyring, texts)
    status, body, _ = detect(base_url, detect_only, text, explain=True)
    assert status == 403 and "explain" in body["error"]["message"]
    status, body, _ = detect(base_url, explainer, text, explain=True)
    assert status == 200
    tokens = body["explanation"]
    assert tokens and all(text[t["char_start"]:t["char_end"]] == t["text"] for t in tokens)
    assert sum(t["green"] is True for t in tokens) > sum(t["green"] is False for t in tokens)
    # The stored verdict keeps no per-token answer: auditors must not learn green lists.
    assert "explanation" not in store.get_verdict(body["id"])


def test_tokens_and_scopes(service):
    base_url, store, _ = service
    status, body, headers = detect(base_url, None, "hello")
    assert status == 401 and body["error"]["code"] == "unauthorized" and "Bearer" in headers["WWW-Authenticate"]
    assert detect(base_url, "pmk_" + "x" * 43, "hello")[0] == 401
    detect_only, auditor = make_token(store, "detect"), make_token(store, "audit")
    for path in ("/v1/verdicts", "/v1/audit", "/v1/audit/verify", "/v1/verdicts/some-id"):
        assert call("GET", base_url + path, token=detect_only)[0] == 403
    assert detect(base_url, auditor, "hello")[0] == 403


def test_rate_limit_answers_429_with_retry_after(provmark_home, keyring):
    app = make_app(provmark_home, rate_limit=1, rate_burst=2)
    token = make_token(services_of(app).store, "detect")
    with serve(app) as base_url:
        statuses = [detect(base_url, token, "short")[0] for _ in range(2)]
        status, body, headers = detect(base_url, token, "short")
    assert statuses == [200, 200]
    assert status == 429 and body["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1


def test_the_public_key_route_is_rate_limited_per_address(provmark_home, keyring):
    """The one keyed route without a token (a two-part key's published half) is held to the same limit per
    client address: a token's limit cannot be sidestepped by asking without one."""
    keyring.create("pub", public_half=True)
    app = make_app(provmark_home, rate_limit=1, rate_burst=2)
    with serve(app) as base_url:
        statuses = [call("GET", f"{base_url}/v1/keys/pub/public-half")[0] for _ in range(2)]
        status, body, headers = call("GET", f"{base_url}/v1/keys/nobody/public")  # unknown ids count too
    assert statuses == [200, 200]
    assert status == 429 and body["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1


# ---- request errors ----------------------------------------------------------------------------

def test_request_errors_are_json_and_name_the_field(provmark_home, keyring):
    app = make_app(provmark_home, max_text_chars=50)
    token = make_token(services_of(app).store, "detect")
    with serve(app) as base_url:
        url = base_url + "/v1/detect"
        status, body, _ = call("POST", url, raw=b"{not json", token=token, headers={"Content-Type": "application/json"})
        assert status == 400 and body["error"]["code"] == "invalid_json"
        cases = [
            ({"text": "hi", "colour": True}, "colour"),
            ({"text": 5}, "text"),
            ({"text": "hi", "watermark": "kgw:h=zero"}, "watermark"),
            ({"text": "hi", "watermark": "nonsense"}, "watermark"),
            ({"text": "hi", "keys": ["Bad Id!"]}, "keys.0"),
            ({"text": "hi", "keys": [KEY], "all_keys": True}, "all_keys"),
            ({"text": "hi", "z_threshold": -1}, "z_threshold"),
            ({"text": "hi", "fpr": 1.5}, "fpr"),
            ({"text": "hi", "watermark": "hf:greenlist_ratio=0.25", "keys": [KEY]}, "keys"),
            ({"text": "lone \ud800 surrogate"}, "text"),
        ]
        for payload, field in cases:
            status, body, _ = call("POST", url, payload, token=token)
            assert status == 422, payload
            assert field in [d["field"] for d in body["error"]["details"]], (payload, body)
        status, body, _ = call("POST", url, {"text": "hi", "keys": ["k-unknown"]}, token=token)
        assert status == 404 and "k-unknown" in body["error"]["message"]
        status, body, headers = call("POST", url, {"text": "x" * 51}, token=token)
        # one name for a refusal past a limit on every route of both services; the old code rides along one release
        assert status == 413 and body["error"]["code"] == "too_large" and body["error"]["param"] == "text"
        assert body["error"]["details"][0]["deprecated_code"] == "text_too_large"
        assert headers.get("Deprecation") == "true" and "too_large" in headers.get("Warning", "")
        status, body, _ = call("POST", base_url + "/v1/matches/byContent", raw=b"y" * 51, token=token,
                               headers={"Content-Type": "text/plain"})
        assert status == 413 and body["error"]["code"] == "too_large"
        assert body["error"]["details"][0]["deprecated_code"] == "text_too_large"
        status, body, _ = call("POST", url, {"text": "é" * 50}, token=token)
        assert status == 200  # the limit counts characters, not bytes
        status, body, _ = call("GET", base_url + "/no/such/route")
        assert status == 404 and body["error"]["code"] == "not_found"
        status, body, headers = call("PUT", url, {"text": "hi"}, token=token)
        assert status == 405 and body["error"]["code"] == "method_not_allowed" and "POST" in headers["Allow"]


# ---- provenance ------------------------------------------------------------------------------------

def test_provenance_links_the_receipt_of_the_same_text(service, keyring, provmark_home, texts):
    base_url, store, admin = service
    text = marked(keyring, texts)
    receipt = issue_receipt(store, signing_keys_for(store, provmark_home).receipts, "test",
                            text_sha256=text_sha256(text),
                            token_count=200, model_id="SmolLM2-135M-Instruct", spec_fingerprint="f" * 32,
                            key_id=KEY)
    status, body, _ = detect(base_url, admin, text)
    assert status == 200 and body["provenance"]["receipt_id"] == receipt["receipt_id"]
    assert body["provenance"]["match"] == "exact" and body["provenance"]["signature"] == receipt["signature"]
    assert store.get_verdict(body["id"])["receipt_id"] == receipt["receipt_id"]
    # Invisible characters picked up on the way: linked after normalisation, and said so.
    tampered = text.replace(" ", " " + ZERO_WIDTH_SPACE, 3)
    status, body, _ = detect(base_url, admin, tampered)
    assert body["provenance"]["match"] == "normalized" and body["verdict"] == "watermarked"
    status, body, _ = detect(base_url, admin, tampered, normalize=False)
    assert body["provenance"] is None
    assert detect(base_url, admin, texts)[1]["provenance"] is None


# ---- verdict queries ------------------------------------------------------------------------------

def test_verdict_filters_pages_and_csv(service, keyring, texts):
    base_url, _, admin = service
    watermarked = marked(keyring, texts)
    ids = {}
    for name, text in (("w1", watermarked), ("h1", texts), ("e1", ""), ("w2", watermarked + " More."),
                       ("h2", human_text(1500, 20000))):
        status, body, _ = detect(base_url, admin, text)
        assert status == 200
        ids[name] = body
    url = base_url + "/v1/verdicts"

    def listed(query: str) -> list[str]:
        status, body, _ = call("GET", f"{url}?{query}", token=admin)
        assert status == 200, body
        return [item["id"] for item in body["items"]]

    assert listed("") == [ids[n]["id"] for n in ("h2", "w2", "e1", "h1", "w1")]  # newest first
    assert set(listed("verdict=watermarked")) == {ids["w1"]["id"], ids["w2"]["id"]}
    assert set(listed("min_z=4")) == {ids["w1"]["id"], ids["w2"]["id"]}
    assert listed(f"text_sha256={ids['h1']['text_sha256']}") == [ids["h1"]["id"]]
    assert len(listed(f"key_id={KEY}")) == 5 and listed("key_id=other") == []
    assert listed("since=2999-01-01T00:00:00Z") == [] and len(listed("until=2999-01-01T00:00:00")) == 5

    seen, cursor = [], None
    while True:
        status, page, _ = call("GET", f"{url}?limit=2" + (f"&cursor={cursor}" if cursor else ""), token=admin)
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == listed("")
    status, body, _ = call("GET", f"{url}?cursor=not-a-cursor", token=admin)
    assert status == 422 and body["error"]["details"][0]["field"] == "cursor"
    for query in ("verdict=maybe", "min_z=nan", "limit=0", "since=yesterday", "colour=red"):
        assert call("GET", f"{url}?{query}", token=admin)[0] == 422, query

    for extra in ({"query": "?format=csv&verdict=watermarked"}, {"query": "?verdict=watermarked",
                                                                  "headers": {"Accept": "text/csv"}}):
        status, body, headers = call("GET", url + extra["query"], token=admin, headers=extra.get("headers"))
        assert status == 200 and headers["Content-Type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(body)))
        assert {row["id"] for row in rows} == {ids["w1"]["id"], ids["w2"]["id"]}
        assert all(row["verdict"] == "watermarked" and float(row["z"]) > 4 for row in rows)
    assert call("GET", f"{base_url}/v1/verdicts/no-such-id", token=admin)[0] == 404


def test_audit_pages_follow_the_chain(service):
    base_url, _, admin = service
    for _ in range(3):
        assert detect(base_url, admin, "a few words")[0] == 200
    seqs, after = [], 0
    while after is not None:
        status, page, _ = call("GET", f"{base_url}/v1/audit?limit=2&after_seq={after}", token=admin)
        assert status == 200
        seqs += [e["seq"] for e in page["items"]]
        after = page["next_after_seq"]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 4  # bootstrap token + 3 detections
    assert call("GET", f"{base_url}/v1/audit?after_seq=-1", token=admin)[0] == 422


# ---- bootstrap, meta -----------------------------------------------------------------------------

def test_bootstrap_admin_token_is_kept_private_and_out_of_logs(provmark_home, keyring, capsys):
    """stderr is captured here, as a service log is: the token is not printed, the file is named once.
    (It is printed only to a terminal: db.api_tokens.announce_admin_token.)"""
    first = make_app(provmark_home)
    token = (provmark_home / "admin.token").read_text().strip()
    assert stat.S_IMODE(os.stat(provmark_home / "admin.token").st_mode) == 0o600
    make_app(provmark_home)
    err = capsys.readouterr().err
    assert token not in err and err.count("admin.token") == 1
    with serve(first) as base_url:
        assert call("GET", base_url + "/v1/audit/verify", token=token)[0] == 200


def test_healthz_openapi_and_page(service):
    base_url, _, _ = service
    status, body, _ = call("GET", base_url + "/healthz")
    assert status == 200 and body["status"] == "ok" and body["database"] == "sqlite"
    status, doc, _ = call("GET", base_url + "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert doc["paths"]["/v1/detect"]["post"]["x-required-scope"] == "detect"
    for path in ("/v1/verdicts", "/v1/verdicts/{verdict_id}", "/v1/audit", "/v1/audit/verify"):
        assert doc["paths"][path]["get"]["x-required-scope"] == "audit"
    assert "text/csv" in doc["paths"]["/v1/verdicts"]["get"]["responses"]["200"]["content"]
    assert {"404", "413", "422"} <= set(doc["paths"]["/v1/detect"]["post"]["responses"])
    status, page, headers = call("GET", base_url + "/")
    assert status == 200 and "Content-Security-Policy" in headers and 'id="detect-form"' in page
    assert "http://" not in page and "https://" not in page  # nothing external
    assert call("GET", base_url + "/static/detector.js")[0] == 200


# ---- the database goes away --------------------------------------------------------------------

def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_unreachable_database_answers_503_and_the_page_still_loads(provmark_home, keyring):
    url = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/provmark"
    app = make_app(provmark_home, database_url=url)
    with serve(app) as base_url:
        for method, path, body in (("GET", "/healthz", None), ("POST", "/v1/detect", {"text": "hi"}),
                                   ("GET", "/v1/verdicts", None)):
            status, answer, headers = call(method, base_url + path, body, token="pmk_" + "a" * 43)
            assert status == 503, path
            assert answer["error"]["code"] == "database_unavailable" and headers["Retry-After"]
        assert call("GET", base_url + "/")[0] == 200


def _pg_ctl(server, *args: str) -> None:
    """Stop or start the test's own PostgreSQL server in place (tests/pg.py's server, same options)."""
    command = [*server._run_as, str(server.bin_dir / "pg_ctl"), *args, "-D", str(server.data_dir)]
    subprocess.run(command, check=True, capture_output=True, timeout=90)


def test_database_lost_mid_run_writes_nothing_and_recovers(provmark_home, keyring, texts):
    import pg

    if pg.find_bin_dir() is None:
        pg.postgres_server()  # skips, or fails under CI=true, with the reason
    server = pg.PostgresServer(pg.find_bin_dir())  # our own server: stopping it disturbs no other test
    try:
        app = make_app(provmark_home, database_url=server.create_database())
        store = services_of(app).store
        token = make_token(store, "detect", "audit")
        with serve(app) as base_url:
            assert detect(base_url, token, texts)[0] == 200

            def counts():
                with store.read() as session:
                    return (session.scalar(select(func.count()).select_from(VerdictRow)),
                            session.scalar(select(func.count()).select_from(AuditEventRow)))

            before = counts()
            _pg_ctl(server, "stop", "-m", "fast")  # clean stop: the test server runs with fsync off
            status, body, _ = detect(base_url, token, texts)
            assert status == 503 and body["error"]["code"] == "database_unavailable"
            options = (f"-p {server.port} -k {server.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off")
            _pg_ctl(server, "start", "-w", "-l", str(server.root / "server.log"), "-o", options)
            deadline = time.monotonic() + 30
            while (status := detect(base_url, token, texts)[0]) == 503 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert status == 200
            assert counts() == (before[0] + 1, before[1] + 1)  # the 503 left no verdict and no event
            report = call("GET", base_url + "/v1/audit/verify", token=token)[1]
            assert report["ok"] is True
        store.close()
    finally:
        server.stop()


# ---- an attacker trying things -------------------------------------------------------------------------------

def test_bad_tokens_in_a_row_get_429_after_a_small_burst_and_one_audit_event(provmark_home, keyring):
    from api.http import THROTTLED_EVENT
    from api.limits import AUTH_FAILURE_BURST
    from db.audit import list_events

    app = make_app(provmark_home, rate_limit=0)  # the throttle holds with the rate limit off
    store = services_of(app).store
    good = make_token(store, "detect")
    guesses = [f"pmk_{i:02d}" + "x" * 41 for i in range(12)]  # a prefix each
    with serve(app) as base_url:
        answers = [detect(base_url, guess, "hello") for guess in guesses]
        assert [status for status, _, _ in answers] == [401] * AUTH_FAILURE_BURST + [429] * (12 - AUTH_FAILURE_BURST)
        for _, body, headers in answers[AUTH_FAILURE_BURST:]:
            assert body["error"]["code"] == "too_many_failed_authentications"
            assert 1 <= int(headers["Retry-After"]) <= 60
        # a live token from the same address still passes (behind a proxy every client shares its address)
        assert detect(base_url, good, "hello")[0] == 200
    events = list_events(store, kind=THROTTLED_EVENT)
    assert len(events) == 1  # the address; each guess had its own prefix
    details = events[0].details
    assert details["throttled"] == "address" and details["address"] == "127.0.0.1"
    assert not any(guess[:12] in str(details) for guess in guesses)
    store.close()


def test_one_leaked_token_prefix_is_throttled_from_every_address(provmark_home, keyring):
    from api.http import THROTTLED_EVENT
    from db.audit import list_events

    app = make_app(provmark_home, rate_limit=0)
    store = services_of(app).store
    revoked = "pmk_" + "R" * 43
    client = app.test_client()  # the WSGI environ names a client address per request: eight of them, one token
    statuses = [client.post("/v1/detect", json={"text": "hello"}, headers={"Authorization": f"Bearer {revoked}"},
                            environ_base={"REMOTE_ADDR": f"192.0.2.{i}"}).status_code for i in range(8)]
    assert statuses == [401] * 5 + [429] * 3
    events = list_events(store, kind=THROTTLED_EVENT)
    assert [e.details["throttled"] for e in events] == ["prefix"]
    assert len(events[0].details["prefix_sha256"]) == 16 and "RRRR" not in str(events[0].details)
    store.close()


def test_anonymous_routes_are_limited_per_address_and_answers_carry_the_security_headers(provmark_home, keyring):
    from api.limits import PAGE_CSP

    app = make_app(provmark_home, rate_limit=60, rate_burst=2)
    store = services_of(app).store
    with serve(app) as base_url:
        statuses = [call("GET", base_url + path)[0] for path in
                    ("/openapi.json", "/.well-known/jwks.json", "/v1/c2pa/trust-anchors", "/openapi.json")]
        assert statuses == [200, 200, 429, 429]
        status, page, headers = call("GET", base_url + "/")
        assert status == 200 and headers["Content-Security-Policy"] == PAGE_CSP
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"
    store.close()


# ---- bulk reads in bounded memory ----------------------------------------------------------------------------

def test_a_large_csv_export_streams_every_row_in_order(service):
    from db.caller import Caller
    from db.verdicts import MAX_PAGE_SIZE, VerdictRecord, record_verdicts

    base_url, store, admin = service
    count = 2 * MAX_PAGE_SIZE + 517  # three pages
    records = [VerdictRecord(
        text_sha256=text_sha256(f"text {i}"), verdict="not_watermarked", z=0.5, p_value=0.3, green_count=25,
        scored_count=100, green_fraction=0.25, spec="kgw:scheme=selfhash", spec_fingerprint="ab" * 8,
        tokenizer_fingerprint="cd" * 8, key_id=KEY, options={}) for i in range(count)]
    ids = record_verdicts(store, records, Caller(name="bulk"))
    status, body, headers = call("GET", base_url + "/v1/verdicts?format=csv", token=admin)
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    assert headers.get("Transfer-Encoding") == "chunked" and "Content-Length" not in headers  # streamed
    rows = list(csv.DictReader(io.StringIO(body)))
    assert len(rows) == count
    newest_first = sorted(((row["created_at"], row["id"]) for row in rows), reverse=True)
    assert [(row["created_at"], row["id"]) for row in rows] == newest_first  # the pages' order, no row twice
    assert {row["id"] for row in rows} == set(ids)


def test_audit_verify_walks_the_database_a_few_times_per_token_and_says_so(service):
    from api.detector.routes_audit import VERIFY_BURST

    base_url, store, admin = service
    auditor = make_token(store, "audit")
    answers = [call("GET", base_url + "/v1/audit/verify", token=auditor) for _ in range(VERIFY_BURST + 1)]
    assert [status for status, _, _ in answers] == [200] * VERIFY_BURST + [429]
    _, body, headers = answers[-1]
    assert "whole database" in body["error"]["message"] and "provmark audit verify" in body["error"]["message"]
    assert 60 <= int(headers["Retry-After"]) <= 300
    assert call("GET", base_url + "/v1/audit/verify", token=admin)[0] == 200  # per token
