"""The transparency log over the audit events (RFC 9162 Merkle tree, signed tree heads, proofs), checked by
an independent verifier written here from RFC 9162 §2.1 and §4.9/§4.10 and C2SP tlog-checkpoint/signed-note:
it imports nothing of provenance.merkle or provenance.tree_head, only hashlib and cryptography."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_fixtures import call, make_token, serve, shared_vocabulary
from identity_fixtures import signing_keys_for
from sqlalchemy import func, select, text

from api.cli import main
from api.detector.app import create_app, services_of
from db.audit import GENESIS_HASH, append_event, event_hash, verify
from db.audit_report import (
    DELETED,
    EDITED,
    LEAF_MISMATCH,
    TREE_HEAD_MISMATCH,
    TREE_HEAD_SIGNATURE,
)
from db.caller import Caller
from db.migrations import alembic_config, head_revision
from db.receipts import ReceiptSigner, sign_receipt, store_receipt
from db.rows import AuditEventRow, TreeHeadRow, iso_utc, utc_now
from db.store import Store
from db.transparency import (
    LogError,
    LogNotFound,
    consistency_proof,
    inclusion_proof,
    keep_tree_head,
)
from db.verdicts import VerdictRecord
from provenance import merkle
from provenance.log_signer import LogSigner

pytest_plugins = ["pg"]

REPO = Path(__file__).resolve().parent.parent
ROW_DIGEST = "ab" * 32
MANIFEST_DIGEST = "cd" * 32


# ---- the independent verifier (RFC 9162 §2.1.3.2, §2.1.4.2; §4.9/4.10; C2SP checkpoint) -----------------

def rfc_leaf(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def rfc_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def rfc_mth(leaves: list[bytes]) -> bytes:
    """MTH(D[n]) by the RFC's recursive definition, over leaf hashes."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return rfc_node(rfc_mth(leaves[:k]), rfc_mth(leaves[k:]))


def rfc_verify_inclusion(leaf_index: int, tree_size: int, leaf: bytes, path: list[bytes], root: bytes) -> bool:
    if leaf_index >= tree_size:
        return False
    fn, sn, r = leaf_index, tree_size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = rfc_node(p, r)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn, sn = fn // 2, sn // 2
        else:
            r = rfc_node(r, p)
        fn, sn = fn // 2, sn // 2
    return sn == 0 and r == root


def rfc_verify_consistency(first: int, second: int, first_hash: bytes, second_hash: bytes, path: list[bytes]) -> bool:
    if not path:
        return False
    path = list(path)
    if first & (first - 1) == 0:
        path = [first_hash] + path
    fn, sn = first - 1, second - 1
    while fn % 2 == 1:
        fn, sn = fn // 2, sn // 2
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            fr, sr = rfc_node(c, fr), rfc_node(c, sr)
            if fn % 2 == 0:
                while fn % 2 == 0 and fn != 0:
                    fn, sn = fn // 2, sn // 2
        else:
            sr = rfc_node(sr, c)
        fn, sn = fn // 2, sn // 2
    return fr == first_hash and sr == second_hash and sn == 0


def raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def check_head(head: dict, public_raw: bytes) -> bytes:
    """The head's root if its TLS TreeHeadDataV2 signature and its checkpoint signature verify; else raises."""
    key = Ed25519PublicKey.from_public_bytes(public_raw)
    root = base64.b64decode(head["root_hash"])
    assert root.hex() == head["root_hash_hex"] and len(root) == 32
    signed = (head["timestamp"].to_bytes(8, "big") + head["tree_size"].to_bytes(8, "big") + bytes([len(root)]) + root
              + (0).to_bytes(2, "big"))
    assert len(signed) == 51
    key.verify(base64.b64decode(head["signature"]), signed)
    origin, size, root_b64, blank, signature_line, end = head["checkpoint"].split("\n")
    assert (int(size), base64.b64decode(root_b64), blank, end) == (head["tree_size"], root, "", "")
    dash, name, blob = signature_line.split(" ")
    blob = base64.b64decode(blob)
    assert dash == "\u2014" and name == origin
    assert blob[:4] == hashlib.sha256(name.encode() + b"\n\x01" + public_raw).digest()[:4]
    key.verify(blob[4:], f"{origin}\n{size}\n{root_b64}\n".encode())
    return root


def check_inclusion_bundle(bundle: dict, public_raw: bytes) -> bool:
    root = check_head(bundle["tree_head"], public_raw)
    path = [base64.b64decode(p) for p in bundle["inclusion_path"]]
    entry = base64.b64decode(bundle["entry"])
    return bundle["tree_size"] == bundle["tree_head"]["tree_size"] and \
        rfc_verify_inclusion(bundle["leaf_index"], bundle["tree_size"], rfc_leaf(entry), path, root)


def check_consistency_bundle(bundle: dict, public_raw: bytes) -> bool:
    first, second = check_head(bundle["first_head"], public_raw), check_head(bundle["second_head"], public_raw)
    path = [base64.b64decode(p) for p in bundle["consistency_path"]]
    return rfc_verify_consistency(bundle["first_head"]["tree_size"], bundle["second_head"]["tree_size"],
                                  first, second, path)


# ---- the Merkle tree itself ----------------------------------------------------------------------

def _leaves(n: int) -> list[bytes]:
    return [rfc_leaf(f"entry {i}".encode()) for i in range(n)]


def test_roots_and_every_inclusion_path_of_trees_up_to_40_leaves_verify():
    assert merkle.root_hash([]) == hashlib.sha256(b"").digest()
    for n in range(1, 41):
        leaves = _leaves(n)
        root = rfc_mth(leaves)
        assert merkle.root_hash(leaves) == root
        chunked = merkle.ChunkedTree(n, [merkle.root_hash(leaves[i:i + 4]) for i in range(0, n - n % 4, 4)],
                                     lambda i, leaves=leaves: leaves[4 * i:4 * i + 4], chunk=4)
        assert chunked.root() == root
        for m in range(n):
            path = merkle.inclusion_path(m, leaves)
            assert chunked.inclusion_path(m) == path
            assert rfc_verify_inclusion(m, n, leaves[m], path, root), (m, n)
            assert merkle.verify_inclusion(leaves[m], m, n, path, root)
            wrong_leaf = leaves[(m + 1) % n]
            assert n == 1 or not rfc_verify_inclusion(m, n, wrong_leaf, path, root)
            assert not rfc_verify_inclusion(m, n, leaves[m], path, rfc_leaf(b"another root"))
            if path:
                assert not rfc_verify_inclusion(m, n, leaves[m], path[:-1], root)
                assert not merkle.verify_inclusion(leaves[m], m, n, path[:-1] + [rfc_leaf(b"x")], root)
            if m + 1 < n:
                assert not merkle.verify_inclusion(leaves[m], m + 1, n, path, root)


def test_every_consistency_proof_of_trees_up_to_40_leaves_verifies():
    accumulator = merkle.MerkleAccumulator()
    for n in range(1, 41):
        leaves = _leaves(n)
        accumulator.append(leaves[-1])
        assert accumulator.root() == rfc_mth(leaves)
        chunked = merkle.ChunkedTree(n, [merkle.root_hash(leaves[i:i + 8]) for i in range(0, n - n % 8, 8)],
                                     lambda i, leaves=leaves: leaves[8 * i:8 * i + 8], chunk=8)
        for m in range(1, n):
            proof = merkle.consistency_proof(m, leaves)
            assert chunked.consistency_proof(m) == proof
            first, second = rfc_mth(leaves[:m]), rfc_mth(leaves)
            assert rfc_verify_consistency(m, n, first, second, proof), (m, n)
            assert merkle.verify_consistency(m, n, first, second, proof)
            assert not rfc_verify_consistency(m, n, rfc_leaf(b"forked"), second, proof)
            assert not merkle.verify_consistency(m, n, first, rfc_leaf(b"forked"), proof)
            assert not merkle.verify_consistency(m, n, first, second, proof[:-1])
        assert merkle.consistency_proof(n, leaves) == [] and merkle.verify_consistency(n, n, rfc_mth(leaves),
                                                                                         rfc_mth(leaves), [])
    with pytest.raises(merkle.MerkleError):
        merkle.consistency_proof(0, _leaves(3))
    with pytest.raises(merkle.MerkleError):
        merkle.inclusion_path(3, _leaves(3))


# ---- the log over a real store ------------------------------------------------------------------

def _append(store: Store, kind: str, subject: str, details: dict) -> None:
    with store.write() as session:
        append_event(session, kind, "tester", subject, details)


def _verdict(i: int) -> VerdictRecord:
    return VerdictRecord(text_sha256="ab" * 32, verdict="not_watermarked", z=0.1 * i, p_value=0.4, green_count=30,
                         scored_count=100, green_fraction=0.3, spec="kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",
                         spec_fingerprint="f" * 16, tokenizer_fingerprint="t" * 16, key_id="k-1", options={},
                         windows=None, receipt_id=None)


def _fill(store: Store, start: int, count: int, receipts: ReceiptSigner) -> list[str]:
    """``count`` events through the real writers, in turn a verdict, a manifest-like event carrying its own
    ``subject_sha256``, and a receipt; returns their subject ids."""
    subjects = []
    for i in range(start, start + count):
        if i % 3 == 0:
            subjects.append(store.record_verdict(_verdict(i), Caller(name="tester")))
        elif i % 3 == 1:
            subjects.append(f"manifest-{i}")
            _append(store, "key.rotate", subjects[-1], {"subject_sha256": MANIFEST_DIGEST, "row_sha256": ROW_DIGEST})
        else:
            receipt = sign_receipt(receipts, text_sha256="cd" * 32, token_count=3 + i, model_id="m", key_id="k-1",
                                   spec_fingerprint="f" * 16)
            store_receipt(store, receipt, "tester")
            subjects.append(receipt["receipt_id"])
    return subjects


class Log:
    """A store with 6 events, a kept head, 5 more events, a second kept head."""

    def __init__(self, database_url: str, home: Path):
        self.store = Store(url=database_url)
        self.store.upgrade()
        self.signer = LogSigner(home)
        self.public_raw = raw_public(self.signer.public_key)
        self.home_store = Store(home=home)  # the deployment's identity (receipt keys) in another database
        receipts = signing_keys_for(self.home_store, home).receipts
        self.subjects = _fill(self.store, 0, 6, receipts)  # subjects[i] is event seq i + 1
        self.first = keep_tree_head(self.store, self.signer)
        self.subjects += _fill(self.store, 6, 5, receipts)
        self.second = keep_tree_head(self.store, self.signer)


@pytest.fixture
def log(database_url, provmark_home):
    log = Log(database_url, provmark_home)
    yield log
    log.store.close()
    log.home_store.close()


def _sql(store: Store, statement: str, **params) -> None:
    with store.engine.begin() as connection:
        connection.execute(text(statement), params)


def test_an_event_is_proven_in_the_signed_tree_by_subject_seq_or_event_id(log):
    store, signer, public_raw, first = log.store, log.signer, log.public_raw, log.first
    assert (first.tree_size, log.second.tree_size) == (6, 11)
    bundle = inclusion_proof(store, signer, "manifest-4")
    assert check_inclusion_bundle(bundle, public_raw)
    assert bundle["leaf_index"] == 4 and bundle["tree_head"]["tree_size"] == 11
    with store.read() as session:
        row = session.get(AuditEventRow, 5)
    entry = base64.b64decode(bundle["entry"])
    assert json.loads(entry) == bundle["entry_json"] == {
        "v": 1, "seq": 5, "event_id": row.event_id, "kind": "key.rotate", "subject_id": "manifest-4",
        "subject_sha256": MANIFEST_DIGEST, "created_at": iso_utc(row.created_at), "event_hash": row.hash}
    assert entry == json.dumps(bundle["entry_json"], sort_keys=True, separators=(",", ":")).encode()
    assert row.leaf_hash == rfc_leaf(entry).hex()
    verdict = inclusion_proof(store, signer, log.subjects[3], tree_size=6)
    with store.read() as session:
        verdict_event = session.get(AuditEventRow, 4)
    assert verdict["entry_json"]["subject_sha256"] == json.loads(verdict_event.details)["row_sha256"]
    assert verdict["tree_head"] == first.to_dict() and check_inclusion_bundle(verdict, public_raw)
    receipt = inclusion_proof(store, signer, log.subjects[2])
    assert receipt["entry_json"]["kind"] == "generation" and check_inclusion_bundle(receipt, public_raw)
    assert check_inclusion_bundle(inclusion_proof(store, signer, "1"), public_raw)
    assert check_inclusion_bundle(inclusion_proof(store, signer, row.event_id, tree_size=11), public_raw)
    tampered = json.loads(json.dumps(bundle))
    tampered["inclusion_path"][0] = base64.b64encode(rfc_leaf(b"not a sibling")).decode()
    assert not check_inclusion_bundle(tampered, public_raw)
    with pytest.raises(LogError, match="not in the tree of size 6"):
        inclusion_proof(store, signer, log.subjects[7], tree_size=6)
    with pytest.raises(LogNotFound):
        inclusion_proof(store, signer, "no-such-subject")
    with pytest.raises(LogNotFound, match="no kept tree head has size 7"):
        inclusion_proof(store, signer, "1", tree_size=7)


def test_consistency_between_kept_heads_verifies_and_verify_checks_the_heads(log):
    store, signer, public_raw, first, second = log.store, log.signer, log.public_raw, log.first, log.second
    bundle = consistency_proof(store, 6, 11)
    assert check_consistency_bundle(bundle, public_raw)
    assert bundle["first_head"] == first.to_dict() and bundle["second_head"] == second.to_dict()
    assert check_head(keep_tree_head(store, signer, reuse_within_s=60).to_dict(), public_raw)  # the newest, kept
    with store.read() as session:
        assert session.scalar(select(func.count()).select_from(TreeHeadRow)) == 2
    report = verify(store, log_key=signer.public_key)
    assert report.ok and report.tree_heads_checked == 2, report.problems
    with pytest.raises(LogError):
        consistency_proof(store, 11, 6)
    with pytest.raises(LogNotFound):
        consistency_proof(store, 5, 11)


def test_an_edited_event_is_reported_and_no_longer_proves_against_the_kept_head(log):
    store, signer, public_raw = log.store, log.signer, log.public_raw
    before = inclusion_proof(store, signer, "manifest-1", tree_size=11)
    _sql(store, "UPDATE audit_events SET details = :d WHERE seq = 2", d=json.dumps({"subject_sha256": "ee" * 32}))
    report = verify(store, log_key=signer.public_key)
    assert [(p.seq, p.problem) for p in report.problems if p.seq is not None] == [(2, EDITED)]
    assert [p.problem for p in report.problems if p.seq is None] == [TREE_HEAD_MISMATCH] * 2, report.problems
    after = inclusion_proof(store, signer, "manifest-1", tree_size=11)
    assert not check_inclusion_bundle(after, public_raw)
    assert check_inclusion_bundle(before, public_raw)  # what the log said stays checkable


def test_a_deleted_event_is_reported_and_the_log_refuses_to_prove_or_sign(log):
    store, signer = log.store, log.signer
    _sql(store, "DELETE FROM audit_events WHERE seq = 2")
    report = verify(store, log_key=signer.public_key)
    assert report.problems[0].problem == DELETED and report.problems[0].seq == 2
    assert [p.problem for p in report.problems if p.seq is None] == [TREE_HEAD_MISMATCH] * 2, report.problems
    with pytest.raises(LogError, match="event 2"):
        inclusion_proof(store, signer, log.subjects[7])
    with pytest.raises(LogError, match="event 2"):
        keep_tree_head(store, signer)


def test_a_forged_head_or_a_rewritten_leaf_hash_is_caught(log):
    store, signer, first = log.store, log.signer, log.first
    _sql(store, "UPDATE tree_heads SET root_hash = :r WHERE tree_size = 6", r="00" * 32)
    report = verify(store, log_key=signer.public_key)
    assert {p.problem for p in report.problems} == {TREE_HEAD_SIGNATURE, TREE_HEAD_MISMATCH}, report.problems
    assert TREE_HEAD_SIGNATURE in {p.problem for p in verify(store).problems}  # no key given: nothing vouched for
    _sql(store, "UPDATE tree_heads SET root_hash = :r WHERE tree_size = 6", r=first.root_hash.hex())
    assert verify(store, log_key=signer.public_key).ok
    _sql(store, "UPDATE audit_events SET leaf_hash = :h WHERE seq = 2", h="11" * 32)
    assert [p.problem for p in verify(store, log_key=signer.public_key).problems] == [LEAF_MISMATCH]
    with pytest.raises(LogError, match="refusing to sign"):
        keep_tree_head(store, signer)  # never a head that forks from one already signed


# ---- the migration -------------------------------------------------------------------------------

def test_the_migration_gives_existing_events_their_leaf_hashes(database_url, provmark_home):
    store = Store(url=database_url)
    config = alembic_config()
    with store.write_engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0006_verdict_shown_view")
    previous = GENESIS_HASH
    with store.write_engine.begin() as connection:  # what 0006's service wrote: events without leaf hashes
        for seq in range(1, 6):
            created = utc_now()
            details = {"row_sha256": ROW_DIGEST} if seq % 2 else {"status": "active"}
            digest = event_hash(previous, f"event-{seq}", "key.rotate", "old", f"v-{seq}", iso_utc(created), details)
            connection.execute(AuditEventRow.__table__.insert().values(
                seq=seq, event_id=f"event-{seq}", kind="key.rotate", actor="old", subject_id=f"v-{seq}",
                created_at=created, details=json.dumps(details, sort_keys=True, separators=(",", ":")),
                prev_hash=previous, hash=digest))
            previous = digest
        connection.execute(text("UPDATE audit_head SET seq = 5, hash = :h"), {"h": previous})
    assert store.upgrade() == head_revision()
    signer = LogSigner(provmark_home)
    bundle = inclusion_proof(store, signer, "v-3")
    assert check_inclusion_bundle(bundle, raw_public(signer.public_key))
    assert bundle["entry_json"]["subject_sha256"] == ROW_DIGEST and bundle["tree_size"] == 5
    report = verify(store, log_key=signer.public_key)
    assert report.ok and report.tree_heads_checked == 1, report.problems
    store.close()


# ---- the command line ----------------------------------------------------------------------------

def _cli(*args: str, env_home: Path, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROVMARK_HOME": str(env_home), "PROVMARK_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_cli_proves_and_checks_offline(provmark_home, tmp_path, monkeypatch, capsys):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("PROVMARK_DATABASE_URL", url)
    store = Store(url=url)
    receipts = signing_keys_for(store, provmark_home).receipts  # the identity: event 1
    _fill(store, 0, 5, receipts)
    assert main(["audit", "head", "--json"]) == 0
    head = json.loads(capsys.readouterr().out)
    assert head["tree_size"] == 6
    assert main(["audit", "log-key", "--pem"]) == 0
    pem = tmp_path / "log.pem"
    pem.write_text(capsys.readouterr().out)
    assert main(["audit", "log-key", "--json"]) == 0
    (tmp_path / "jwks.json").write_text(json.dumps(json.loads(capsys.readouterr().out)["jwks"]))
    proof = tmp_path / "proof.json"
    made = _cli("audit", "prove", "manifest-1", "--out", str(proof), env_home=provmark_home, url=url)
    assert made.returncode == 0 and "leaf 2 of 6" in made.stdout, made.stderr
    checked = _cli("audit", "check-proof", str(proof), "--log-key", str(pem), env_home=provmark_home, url=url)
    assert checked.returncode == 0 and checked.stdout.startswith("OK: event 3 (key.rotate, subject manifest-1)"), \
        checked.stderr
    assert check_inclusion_bundle(json.loads(proof.read_text()), base64.b64decode(pem.read_text().split("\n")[1])[-32:])
    bad_key = _cli("audit", "check-proof", str(proof), "--log-key", "not-a-key", env_home=provmark_home, url=url)
    assert bad_key.returncode == 2 and "--log-key" in bad_key.stderr and not bad_key.stdout
    capsys.readouterr()
    assert main(["audit", "check-proof", str(proof), "--log-key", str(tmp_path / "jwks.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    bundle = json.loads(proof.read_text())
    bundle["entry_json"]["subject_id"] = "manifest-9"
    bundle["entry"] = base64.b64encode(json.dumps(bundle["entry_json"], sort_keys=True,
                                                  separators=(",", ":")).encode()).decode()
    proof.write_text(json.dumps(bundle))
    assert main(["audit", "check-proof", str(proof), "--log-key", str(pem)]) == 1
    assert capsys.readouterr().out.startswith("FAILED: the inclusion path does not lead")
    _fill(store, 5, 2, receipts)
    store.close()
    assert main(["audit", "head"]) == 0 and "tree head of size 8" in capsys.readouterr().out
    assert main(["audit", "prove", "--consistency", "6", "8", "--out", str(proof)]) == 0
    capsys.readouterr()
    assert main(["audit", "check-proof", str(proof), "--log-key", pem.read_text()]) == 0
    assert "extends the log at size 6" in capsys.readouterr().out
    missing = str(tmp_path / "gone.json")
    for argv, message in ((["audit", "prove", "nothing-like-this"], "no audit event"),
                          (["audit", "prove", "--consistency", "6", "7"], "no kept tree head has size 7"),
                          (["audit", "prove"], "give an event ID"),
                          (["audit", "check-proof", missing, "--log-key", str(pem)], "cannot read")):
        assert main(argv) == 2
        assert message in capsys.readouterr().err


# ---- HTTP ----------------------------------------------------------------------------------------

def test_the_detector_serves_heads_keys_and_proofs(provmark_home, database_url):
    app = create_app({"home": provmark_home, "vocab": shared_vocabulary(), "database_url": database_url})
    store = services_of(app).store
    keys = signing_keys_for(store, provmark_home)  # the deployment's identity, as `provmark identity init` makes it
    subjects = _fill(store, 0, 4, keys.receipts)
    auditor, audit_only = make_token(store, "audit", "explain"), make_token(store, "audit")
    with serve(app) as base:
        status, key, _ = call("GET", base + "/v1/log/public-key")
        assert status == 200 and key["jwk"]["kty"] == "OKP" and key["jwk"]["crv"] == "Ed25519"
        public_raw = base64.urlsafe_b64decode(key["jwk"]["x"] + "=")
        assert public_raw == raw_public(keys.log.public_key)
        thumbprint = base64.urlsafe_b64encode(hashlib.sha256(json.dumps(
            {"crv": "Ed25519", "kty": "OKP", "x": key["jwk"]["x"]}, sort_keys=True, separators=(",", ":")).encode())
            .digest()).rstrip(b"=").decode()
        assert key["jwk"]["kid"] == key["key_id"] == thumbprint
        status, body, _ = call("GET", base + "/v1/log/head")
        assert status == 404 and set(body) == {"error"}  # the detector signs nothing: no head yet
        status, body, _ = call("GET", base + "/v1/log/proof/inclusion?id=manifest-1", token=auditor)
        assert status == 409 and "no signed tree head covers it yet" in body["error"]["message"]
        keep_tree_head(store, keys.log)  # what the generation service's sequencer does every few seconds
        status, head, _ = call("GET", base + "/v1/log/head")
        assert status == 200 and check_head(head, public_raw) and head["key_id"] == thumbprint
        first_size = head["tree_size"]  # the identity and token creation are logged too
        subjects += _fill(store, 4, 2, keys.receipts)
        assert call("GET", base + "/v1/log/head")[1] == head  # the newest kept head, until one is signed
        keep_tree_head(store, keys.log)
        status, grown, _ = call("GET", base + "/v1/log/head")
        assert status == 200 and grown["tree_size"] == first_size + 2 and check_head(grown, public_raw)
        query = f"/v1/log/proof/inclusion?id=manifest-1&tree_size={first_size}"
        assert call("GET", base + query)[0] == 401
        assert call("GET", base + query, token=audit_only)[0] == 403
        status, bundle, _ = call("GET", base + query, token=auditor)
        assert status == 200 and check_inclusion_bundle(bundle, public_raw) and bundle["tree_head"] == head
        consistency = f"/v1/log/proof/consistency?first={first_size}&second={first_size + 2}"
        status, bundle, _ = call("GET", base + consistency)  # no token: what a witness asks for
        assert status == 200 and check_consistency_bundle(bundle, public_raw)
        assert call("GET", base + consistency, token=audit_only)[1] == bundle
        for path, expected in (("/v1/log/proof/inclusion?id=nope", 404),
                               ("/v1/log/proof/inclusion?id=manifest-1&tree_size=0", 422),
                               ("/v1/log/proof/inclusion?id=manifest-1&tree_size=999", 404),
                               (f"/v1/log/proof/inclusion?id={subjects[5]}&tree_size={first_size}", 409),
                               ("/v1/log/proof/consistency?first=3&second=2", 404),
                               ("/v1/log/proof/consistency?first=x&second=2", 422),
                               (f"/v1/log/proof/consistency?first=1&second={first_size}", 404)):
            status, body, _ = call("GET", base + path, token=auditor)
            assert status == expected and set(body) == {"error"}, (path, body)
        paths = call("GET", base + "/openapi.json")[1]["paths"]
        assert {"/v1/log/head", "/v1/log/public-key", "/v1/log/proof/inclusion",
                "/v1/log/proof/consistency"} <= set(paths)
        status, report, _ = call("GET", base + "/v1/audit/verify", token=auditor)
        assert status == 200 and report["ok"] and report["tree_heads_checked"] == 2, report
    store.close()


def test_a_head_signature_check_fails_for_another_key(log, tmp_path):
    other = LogSigner(tmp_path / "elsewhere").public_key  # a standalone log key file
    with pytest.raises(InvalidSignature):
        check_head(log.second.to_dict(), raw_public(other))
    problems = verify(log.store, log_key=other).problems
    assert [p.problem for p in problems] == [TREE_HEAD_SIGNATURE] * 2
