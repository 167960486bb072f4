"""``provmark keys``: in-process through api.cli.main, and once as the installed console script."""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli import main
from watermark.keyring_seal import parse_master_key
from watermark.keys import Keyring


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    monkeypatch.setenv("PROVMARK_HOME", str(folder))
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)
    return folder


@pytest.fixture
def run(capsys):
    def run_cli(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run_cli


def leak_forms(secret: bytes) -> list[str]:
    b64 = [base64.b64encode(secret).decode(), base64.urlsafe_b64encode(secret).decode()]
    hex_forms = [secret.hex(), secret.hex().upper(), base64.b32encode(secret).decode()]
    return hex_forms + b64 + [s.rstrip("=") for s in b64]


def assert_no_secret_in(text: str, home: Path) -> None:
    kr = Keyring(home)
    secrets_ = [kr.secret(info.key_id) for info in kr.list() if not info.purged]
    secrets_.append(parse_master_key((home / "master.key").read_text()))
    for secret in secrets_:
        for form in leak_forms(secret):
            assert form not in text
        assert secret.decode("latin-1") not in text


def test_json_flow_create_rotate_retire_list(home, run):
    code, out, _ = run("keys", "create", "first", "--json")
    assert code == 0
    created = json.loads(out)
    assert created["key_id"] == "first" and created["status"] == "active"
    assert set(created) == {"key_id", "status", "created_at", "retired_at", "fingerprint", "purged", "spec",
                            "public_half", "calibration"}
    # a new key is screened and calibrated under the default spec; only public summary numbers come back
    assert created["calibration"]["id"].startswith("cal-") and created["calibration"]["passes_screen"] is True
    assert created["calibration"]["screening_draws"] >= 1

    code, out, _ = run("keys", "rotate", "--json")
    rotated_to = json.loads(out)
    assert code == 0 and rotated_to["status"] == "active" and rotated_to["key_id"].startswith("k-")

    code, out, _ = run("keys", "retire", "first", "--json")
    assert code == 0 and json.loads(out)["status"] == "retired"

    code, out, _ = run("keys", "list", "--json")
    listed = json.loads(out)
    expected = [("first", "retired"), (rotated_to["key_id"], "active")]
    assert [(k["key_id"], k["status"]) for k in listed] == expected


def test_human_output(home, run):
    code, out, _ = run("keys", "list")
    assert code == 0 and "provmark keys create" in out
    _, out, _ = run("keys", "create", "alpha")
    assert "created key alpha (active" in out
    _, out, _ = run("keys", "create", "beta")
    assert "standby" in out and "provmark keys rotate beta" in out
    _, out, _ = run("keys", "rotate", "beta")
    assert "beta is now active" in out
    code, out, _ = run("keys", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["KEY", "ID", "STATUS"]
    assert [line.split()[:2] for line in lines[1:]] == [["alpha", "rotated"], ["beta", "active"]]
    _, out, _ = run("keys", "retire", "alpha", "--purge")
    assert "retired key alpha" in out and "erased" in out
    _, out, _ = run("keys", "list")
    assert "retired (purged)" in out


def test_no_secret_in_any_output(home, run):
    outputs = []
    for json_flag in ((), ("--json",)):
        for argv in (("create",), ("create",), ("rotate",), ("list",)):
            outputs.append(run("keys", *argv, *json_flag))
        outputs.append(run("keys", "retire", Keyring().list()[0].key_id, *json_flag))
    outputs.append(run("keys", "retire", Keyring().active().key_id))  # an error message too
    assert outputs[-1][0] == 2
    assert_no_secret_in("\n".join(out + err for _, out, err in outputs), home)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("keys", "retire", "solo"), "rotate"),
        (("keys", "retire", "ghost"), "no key ghost"),
        (("keys", "create", "Not Valid"), "invalid key id"),
        (("keys", "create", "solo"), "already exists"),
        (("keys", "rotate", "solo"), "rotate to a new id"),
    ],
)
def test_user_errors_exit_2_with_one_line(home, run, argv, message):
    run("keys", "create", "solo")
    code, out, err = run(*argv)
    assert code == 2 and out == ""
    assert err.startswith("provmark: ") and message in err and err.count("\n") == 1


def test_wrong_and_malformed_master_key(home, run, monkeypatch):
    run("keys", "create")
    monkeypatch.setenv("PROVMARK_MASTER_KEY", "11" * 32)
    code, _, err = run("keys", "list")
    assert code == 2 and "wrong master key" in err
    monkeypatch.setenv("PROVMARK_MASTER_KEY", "nope")
    code, _, err = run("keys", "list", "--json")
    assert code == 2 and "malformed" in err and "nope" not in err


def test_bare_keys_prints_usage(home, run):
    code, _, err = run("keys")
    assert code == 2 and "create" in err and "rotate" in err


def test_console_script_subprocess(home):
    script = Path(sys.executable).with_name("provmark")
    if not script.exists():
        pytest.skip("provmark console script not installed (pip install -e .)")
    env = {**os.environ, "PROVMARK_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("PROVMARK_MASTER_KEY", None)
    def provmark(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([script, *argv], env=env, capture_output=True, text=True, timeout=120)

    created = provmark("keys", "create", "--json")
    assert created.returncode == 0, created.stderr
    listed = provmark("keys", "list")
    assert listed.returncode == 0, listed.stderr
    key_id = json.loads(created.stdout)["key_id"]
    assert key_id in listed.stdout and "active" in listed.stdout
    for name in ("master.key", "keyring.json"):
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o600
    assert_no_secret_in(created.stdout + created.stderr + listed.stdout + listed.stderr, home)


def test_key_actions_write_audit_events_that_verify(provmark_home, capsys):
    from api.cli import main
    from db.audit import list_events, verify
    from db.store import Store

    assert main(["keys", "create", "alpha"]) == 0
    assert main(["keys", "rotate", "beta"]) == 0
    assert main(["keys", "retire", "alpha"]) == 0
    store = Store()
    kinds = [(e.kind, e.subject_id) for e in list_events(store)]
    # a created or rotated-in key is calibrated too: its summary is an audit event of its own
    assert kinds == [("key.create", "alpha"), ("key.calibrate", "alpha"), ("key.rotate", "beta"),
                     ("key.rotate_out", "alpha"), ("key.calibrate", "beta"), ("key.retire", "alpha")]
    calibrated = [e for e in list_events(store) if e.kind == "key.calibrate"]
    assert all(e.details["id"].startswith("cal-") and e.details["passes_screen"] for e in calibrated)
    assert verify(store).ok
    records = {r["key_id"]: r["status"] for r in store.list_key_records()}
    assert records == {"alpha": "retired", "beta": "active"}


def test_a_new_keys_spec_is_checked_and_explained_the_same_way_by_create_and_rotate(home, run):
    for action in ("create", "rotate"):
        code, _, err = run("keys", action, "--watermark", "kgw:scheme=nope", "--no-calibrate")
        assert code == 2 and err.startswith("provmark: --watermark: "), (action, err)  # the option's current name
        code, _, err = run("keys", action, "--watermark", "kgw:scheme=unigram", "--no-calibrate")
        assert code == 0 and "insufficient_text" in err, (action, err)  # unigram cannot judge code: said either way
