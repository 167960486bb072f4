"""Durability of what the signing side answers: a process issues receipts as fast as it can while its head
sequencer signs heads every 0.2 s, and is killed with SIGKILL mid-burst, on SQLite and on PostgreSQL. Every
receipt it answered (printed) is still stored and provable after a restart, and the log's next head is
consistent with the head published before the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from identity_fixtures import signing_keys_for

from db.audit import verify
from db.receipts import get_receipt
from db.store import Store
from db.transparency import HeadGuard, consistency_proof, inclusion_proof, keep_tree_head, newest_head
from provenance.proof_bundle import check_bundle
from watermark.keyring_seal import MASTER_KEY_ENV, format_master_key

pytest_plugins = ["pg"]
REPO = Path(__file__).resolve().parent.parent
ANSWERED_BEFORE_KILL = 60
TIMEOUT_S = 120

ISSUER = textwrap.dedent("""
    import sys
    from api.provenance_keys import SigningKeys
    from api.settings import Settings
    from db.receipts import issue_receipt
    from db.store import Store
    from db.transparency import SIGNER_STATE_FILE, HeadGuard, HeadSequencer

    settings = Settings.load()
    store = Store(url=settings.database_url)
    keys = SigningKeys(settings, store, create=False, actor="issuer")
    HeadSequencer(store, keys.log, 0.2, HeadGuard(settings.home / SIGNER_STATE_FILE)).start()
    i = 0
    while True:
        receipt = issue_receipt(store, keys.receipts, "issuer", text_sha256="%064x" % i, token_count=i,
                                model_id="m", spec_fingerprint="f" * 16, key_id="k-1")
        print(receipt["receipt_id"], flush=True)  # answered: the caller now holds it
        i += 1
""")


def test_sigkill_mid_burst_loses_no_answered_receipt_and_the_log_stays_consistent(database_url, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setenv(MASTER_KEY_ENV, format_master_key(bytes(range(32))))
    home = tmp_path / "issuer-home"
    store = Store(url=database_url)
    signing_keys_for(store, home)  # `provmark identity init`
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROVMARK_HOME": str(home), "PROVMARK_DATABASE_URL": database_url}
    process = subprocess.Popen([sys.executable, "-c", ISSUER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    answered: list[str] = []
    published = None
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline and (len(answered) < ANSWERED_BEFORE_KILL or published is None):
            line = process.stdout.readline()
            assert line, process.stderr.read()
            answered.append(line.strip())
            if len(answered) >= ANSWERED_BEFORE_KILL // 2 and published is None:
                try:
                    published = newest_head(store)  # what an outsider saw before the crash
                except Exception:
                    published = None
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert len(answered) >= ANSWERED_BEFORE_KILL and published is not None

    keys = signing_keys_for(store, home)  # the restart
    for receipt_id in answered:
        assert get_receipt(store, receipt_id) is not None, f"answered receipt {receipt_id} was lost"
    head = keep_tree_head(store, keys.log, guard=HeadGuard(home / "log-signer.json"))
    assert head.tree_size >= published.tree_size
    public_key = keys.log.public_key
    if head.tree_size > published.tree_size:
        assert check_bundle(consistency_proof(store, published.tree_size, head.tree_size), public_key)
    else:
        assert head.root_hash == published.root_hash
    for receipt_id in (answered[0], answered[len(answered) // 2], answered[-1]):
        assert check_bundle(inclusion_proof(store, keys.log, receipt_id), public_key)
    report = verify(store, log_key=keys.log.public_key)
    assert report.ok, report.problems
    store.close()
