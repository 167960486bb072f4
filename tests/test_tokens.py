"""API tokens on SQLite and PostgreSQL: hashed storage, scopes, revocation, bootstrap, the CLI."""

import hashlib
import json
import os
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text

from api.cli import main
from db.api_tokens import (
    ADMIN_TOKEN_FILE,
    SCOPES,
    ScopeError,
    TokenError,
    authenticate,
    create_token,
    ensure_admin_token,
    list_tokens,
    parse_scopes,
    require_scope,
    revoke_token,
)
from db.audit import list_events, verify
from db.rows import ApiTokenRow
from db.store import Store

pytest_plugins = ["pg"]


@pytest.fixture
def store(database_url):
    store = Store(url=database_url)
    store.upgrade()
    yield store
    store.close()


def _every_stored_value(store) -> str:
    """All rows of all tables as one text: what someone with the database would see."""
    with store.read() as session:
        return "\n".join(repr(row) for table in inspect(store.engine).get_table_names()
                         for row in session.execute(text(f"SELECT * FROM {table}")))


def test_token_is_stored_only_as_its_sha256(store):
    token_id, plaintext = create_token(store, ["detect", "explain"], "ci bot")
    assert plaintext.startswith("pmk_") and len(plaintext) == 4 + 43
    with store.read() as session:
        row = session.get(ApiTokenRow, token_id)
    assert row.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    dump = _every_stored_value(store)
    assert plaintext not in dump and plaintext[4:] not in dump
    if store.dialect == "sqlite":  # the raw files too, WAL included
        database = store.url.database
        raw = b"".join(Path(path).read_bytes() for path in (database, database + "-wal")
                       if os.path.exists(path))
        assert plaintext.encode() not in raw and plaintext[4:].encode() not in raw
        assert row.token_hash.encode() in raw


def test_authenticate_accepts_live_tokens_only(store):
    token_id, plaintext = create_token(store, "detect", "reader")
    info = authenticate(store, plaintext)
    assert (info.token_id, info.name, info.scopes) == (token_id, "reader", frozenset({"detect"}))
    wrong = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    for candidate in (wrong, "", "pmk_", plaintext + "x", None, plaintext.upper()):
        assert authenticate(store, candidate) is None
    assert "pmk_" not in repr(info) and "token_hash" not in info.to_dict()


def test_require_scope_enforces_scopes_and_admin_grants_all(store):
    _, detect_token = create_token(store, "detect", "reader")
    _, admin_token = create_token(store, "admin", "ops")
    reader, admin = authenticate(store, detect_token), authenticate(store, admin_token)
    assert require_scope(reader, "detect") is reader
    for scope in ("generate", "explain", "audit", "admin"):
        with pytest.raises(ScopeError, match=scope):
            require_scope(reader, scope)
    assert all(require_scope(admin, scope) is admin for scope in SCOPES)
    with pytest.raises(ScopeError):
        require_scope(None, "detect")
    with pytest.raises(TokenError):
        require_scope(admin, "root")


def test_revoked_tokens_fail_and_revocation_is_audited(store):
    token_id, plaintext = create_token(store, "detect", "temp")
    revoked = revoke_token(store, token_id, actor="token:ops")
    assert revoked.revoked_at is not None
    assert authenticate(store, plaintext) is None
    assert revoke_token(store, token_id).revoked_at == revoked.revoked_at  # idempotent, no second event
    with pytest.raises(TokenError, match="no token"):
        revoke_token(store, "no-such-id")
    kinds = [(e.kind, e.subject_id, e.actor) for e in list_events(store)]
    assert kinds == [("token.create", token_id, "cli"), ("token.revoke", token_id, "token:ops")]
    assert list_events(store)[0].details == {"name": "temp", "scopes": ["detect"]}
    assert verify(store).ok


@pytest.mark.parametrize("scopes", ["", [], "detect,root", ["superuser"]])
def test_unknown_or_empty_scopes_are_refused(scopes):
    with pytest.raises(TokenError, match="scopes"):
        parse_scopes(scopes)


def test_bad_names_are_refused(store):
    for name in ("", " leading space", "x" * 101, "semi;colon"):
        with pytest.raises(TokenError, match="name"):
            create_token(store, "detect", name)
    assert list_tokens(store) == []


def test_ensure_admin_token_bootstraps_once(store, provmark_home):
    plaintext = ensure_admin_token(provmark_home, store=store)
    path = provmark_home / ADMIN_TOKEN_FILE
    assert path.read_text().strip() == plaintext
    assert path.stat().st_mode & 0o777 == 0o600
    assert authenticate(store, plaintext).scopes == frozenset({"admin"})
    assert ensure_admin_token(provmark_home, store=store) is None
    revoke_token(store, authenticate(store, plaintext).token_id)
    replacement = ensure_admin_token(provmark_home, store=store)  # no live admin left: a new one
    assert replacement not in (None, plaintext) and path.read_text().strip() == replacement


def test_ensure_admin_token_defaults_to_the_home_database(provmark_home, monkeypatch):
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    Store(home=provmark_home).upgrade()
    assert ensure_admin_token(provmark_home).startswith("pmk_")
    assert ensure_admin_token(provmark_home) is None


def test_cli_create_list_revoke(provmark_home, monkeypatch, capsys):
    monkeypatch.delenv("PROVMARK_DATABASE_URL", raising=False)
    assert main(["tokens", "create", "--scopes", "detect", "explain", "--name", "ci", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert main(["tokens", "list"]) == 0
    listing = capsys.readouterr().out
    assert created["token_id"] in listing and "detect,explain" in listing and created["token"] not in listing
    assert main(["tokens", "revoke", created["token_id"]]) == 0
    assert "revoked" in capsys.readouterr().out
    assert main(["tokens", "list", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["revoked_at"] is not None and entry["scopes"] == ["detect", "explain"]
    assert main(["tokens", "create", "--scopes", "root"]) == 2
    assert "scopes must be" in capsys.readouterr().err
    with Store(home=provmark_home).read() as session:
        stored_hash = session.scalar(select(ApiTokenRow.token_hash))
    assert stored_hash == hashlib.sha256(created["token"].encode()).hexdigest()


def test_the_bootstrap_token_is_shown_on_a_terminal_and_only_there(tmp_path):
    """A terminal shows it once; anything else (a pipe, a log file) gets where it is, not what it is."""
    import io
    import os

    from db.api_tokens import announce_admin_token

    path = tmp_path / "admin.token"
    log = io.StringIO()
    announce_admin_token("detector", "pmk_secretvalue", path, stream=log)
    assert "pmk_secretvalue" not in log.getvalue() and str(path) in log.getvalue()
    primary, secondary = os.openpty()
    with os.fdopen(secondary, "w") as terminal, os.fdopen(primary, "rb", buffering=0) as reader:
        announce_admin_token("detector", "pmk_secretvalue", path, stream=terminal)
        assert b"pmk_secretvalue" in reader.read(4096)
