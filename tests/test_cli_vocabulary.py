"""The command line speaks one vocabulary (docs/reference/vocabulary.md): --watermark for the spec everywhere,
--key repeatable, --json on every command that prints a result; the old spellings work for one release and
say so on stderr."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cli(*args):
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_keys_take_the_spec_as_watermark_and_spec_still_works_with_a_warning(provmark_home):
    current = cli("keys", "create", "k-new", "--watermark", "kgw:scheme=lefthash,h=1", "--no-calibrate", "--json")
    assert current.returncode == 0 and "deprecated" not in current.stderr, current.stderr
    old = cli("keys", "create", "k-old", "--spec", "kgw:scheme=lefthash,h=1", "--no-calibrate", "--json")
    assert old.returncode == 0 and "--spec is deprecated" in old.stderr and "--watermark" in old.stderr
    listed = {key["key_id"]: key for key in json.loads(cli("keys", "list", "--json").stdout)}
    assert listed["k-new"]["spec"] == listed["k-old"]["spec"] and "lefthash" in listed["k-new"]["spec"]


def test_generate_takes_the_repeatable_key_option_once_and_every_store_command_answers_json(provmark_home):
    twice = cli("generate", "x", "--key", "a", "--key", "b")
    assert twice.returncode == 2 and "one key" in twice.stderr
    upgraded = cli("db", "upgrade", "--json")
    assert upgraded.returncode == 0 and json.loads(upgraded.stdout)["revision"]
    created = json.loads(cli("tokens", "create", "--scopes", "detect", "--json").stdout)
    revoked = cli("tokens", "revoke", created["token_id"], "--json")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["revoked_at"]
