"""The findings of the provenance review, each as it was reported: the log signed a fork after truncation, a
rewritten database got new history signed, anonymous GETs on a fresh detector created every private key, a
production C2PA chain trusted its own root, an older home's keys were not carried over."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from http_fixtures import call, serve, shared_vocabulary
from identity_fixtures import signing_keys_for
from sqlalchemy import func, select, text

from api.detector.app import create_app as create_detector
from db.audit import append_event
from db.identity import load_identity, seal_of
from db.receipts import ReceiptSigner, sign_receipt, verify_receipt_jws
from db.rows import AuditEventRow, IdentityRow, SigningKeyRow
from db.store import Store
from db.transparency import HeadGuard, LogError, keep_tree_head
from provenance.c2pa_credential import C2paCredentialError, C2paSettings, load_c2pa_credential
from provenance.log_signer import LogSigner
from provenance.sealed_key import SealedKeyFile

pytest_plugins = ["pg"]


def _append(store: Store, count: int, tag: str) -> None:
    with store.write() as session:
        for i in range(count):
            append_event(session, "key.rotate", "tester", f"{tag}-{i}", {"n": i})


def _truncate_to(store: Store, size: int) -> None:
    """What someone with write access to the database does: drop the newest events, fix up the chain head."""
    with store.engine.begin() as connection:
        connection.execute(text("DELETE FROM audit_events WHERE seq > :n"), {"n": size})
        last = connection.execute(text("SELECT hash FROM audit_events WHERE seq = :n"), {"n": size}).scalar()
        connection.execute(text("UPDATE audit_head SET seq = :n, hash = :h"), {"n": size, "h": last})


def _heads(store: Store) -> int:
    with store.read() as session:
        return session.scalar(select(func.count()).select_from(text("tree_heads")))


@pytest.mark.parametrize("fresh_signer", [False, True], ids=["same-process", "another-process"])
def test_the_log_never_signs_a_fork_after_truncation_and_regrowth(database_url, provmark_home, fresh_signer):
    store = Store(url=database_url)
    signer = signing_keys_for(store, provmark_home).log
    _append(store, 10, "a")
    kept = keep_tree_head(store, signer)
    _truncate_to(store, 4)
    guard = HeadGuard() if fresh_signer else None  # a signer that never signed before: only the kept heads
    with pytest.raises(LogError, match="events were removed"):
        keep_tree_head(store, signer, guard=guard)  # smaller than a kept head
    _append(store, 20, "b")  # regrown past the kept head, with other events
    reason = "no longer give the root of kept tree head" if fresh_signer else "no longer extends the head of size"
    with pytest.raises(LogError, match=reason):
        keep_tree_head(store, signer, guard=HeadGuard() if fresh_signer else None)
    assert _heads(store) == 1  # nothing was signed after the first head
    with store.read() as session:
        assert session.scalar(select(func.max(AuditEventRow.seq))) > kept.tree_size
    store.close()


def test_a_rewritten_database_that_lost_its_heads_gets_nothing_signed_by_a_signer_that_signed(
        database_url, provmark_home, tmp_path):
    store = Store(url=database_url)
    signer = signing_keys_for(store, provmark_home).log
    state = tmp_path / "log-signer.json"
    _append(store, 8, "a")
    keep_tree_head(store, signer, guard=HeadGuard(state))
    with store.engine.begin() as connection:  # the heads go too: nothing in the database remembers them
        connection.execute(text("DELETE FROM tree_heads"))
    _truncate_to(store, 3)
    _append(store, 12, "b")
    with pytest.raises(LogError, match="no longer extends the head of size"):
        keep_tree_head(store, signer, guard=HeadGuard(state))  # a restarted signer reads what it signed
    assert _heads(store) == 0
    store.close()


def test_anonymous_gets_on_a_fresh_detector_create_no_key(tmp_path):
    home = tmp_path / "fresh"
    app = create_detector({"home": home, "vocab": shared_vocabulary()})
    with serve(app) as base:
        assert call("GET", base + "/.well-known/jwks.json")[1] == {"keys": []}
        for path, status in (("/v1/c2pa/trust-anchors", 404), ("/v1/log/public-key", 404), ("/v1/log/head", 404)):
            got, body, _ = call("GET", base + path)
            assert got == status and set(body) == {"error"}, (path, body)
    made = sorted(p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file())
    assert not [name for name in made if name.endswith((".key", ".pem")) or name.startswith("c2pa")], made
    with Store(home=home).read() as session:
        assert session.scalar(select(func.count()).select_from(SigningKeyRow)) == 0
        assert session.get(IdentityRow, 1) is None


def test_an_older_home_s_keys_are_adopted_so_what_they_signed_keeps_verifying(provmark_home):
    old_log = LogSigner(provmark_home)  # the files a single-machine home kept before
    receipt_file = SealedKeyFile(provmark_home / "receipt-signing.key", "provmark-receipt-key/1",
                                 b"provmark/receipts/signing-key-aes-gcm")
    old_receipt_key = receipt_file.load_or_create()
    store = Store(home=provmark_home)
    keys = signing_keys_for(store, provmark_home)
    assert keys.log.public_key.public_bytes_raw() == old_log.public_key.public_bytes_raw()
    assert keys.receipts.public_key.public_bytes_raw() == old_receipt_key.public_key().public_bytes_raw()
    receipt = sign_receipt(ReceiptSigner(store, seal_of(provmark_home)), text_sha256="ab" * 32, token_count=1,
                           model_id="m", spec_fingerprint="f" * 16, key_id="k-1")
    assert verify_receipt_jws(receipt["jws"], load_identity(store, seal_of(provmark_home)).jwks())
    store.close()


def _certificate(subject: str, key, issuer: str, issuer_key, ca: bool, ekus=()):
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=90))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=not ca, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=ca, crl_sign=ca, encipher_only=False,
                                            decipher_only=False), critical=True))
    if ekus:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(ekus)), critical=False)
    return builder.sign(issuer_key, None)


def test_a_production_chain_needs_named_trust_anchors(tmp_path):
    root_key, leaf_key = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    root = _certificate("Some Public CA", root_key, "Some Public CA", root_key, ca=True)
    leaf = _certificate("anyone's S/MIME", leaf_key, "Some Public CA", root_key, ca=False,
                        ekus=[ExtendedKeyUsageOID.EMAIL_PROTECTION])
    chain, key, anchors = tmp_path / "chain.pem", tmp_path / "key.pem", tmp_path / "anchors.pem"
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + root.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    anchors.write_bytes(root.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(C2paCredentialError, match="PROVMARK_C2PA_TRUST_ANCHORS"):
        load_c2pa_credential(C2paSettings(cert_chain=chain, private_key=key))
    credential = load_c2pa_credential(C2paSettings(cert_chain=chain, private_key=key, trust_anchors=anchors))
    assert credential.trust_anchors_pem.strip() == anchors.read_text().strip() and credential.source == "production"
    with pytest.raises(C2paCredentialError, match="PROVMARK_C2PA_TRUST_ANCHORS"):  # the service refuses to start
        signing_keys_for(Store(home=tmp_path / "home"), tmp_path / "home", c2pa_cert_chain=chain,
                         c2pa_private_key=key)


def test_provmark_serve_refuses_a_replica_with_another_identity_in_one_line(tmp_path):
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo), "PROVMARK_MASTER_KEY": "ab" * 32,
           "PROVMARK_DATABASE_URL": f"sqlite:///{tmp_path / 'shared.db'}"}
    made = subprocess.run([sys.executable, "-m", "api.cli", "identity", "init"], cwd=repo, capture_output=True,
                          text=True, timeout=120, env={**env, "PROVMARK_HOME": str(tmp_path / "admin")})
    assert made.returncode == 0, made.stderr
    stray = tmp_path / "stray"
    LogSigner(stray, master_key=bytes.fromhex("ab" * 32))  # a key file left from a single-machine install
    refused = subprocess.run([sys.executable, "-m", "api.cli", "serve", "detector", "--port", "0"], cwd=repo,
                             capture_output=True, text=True, timeout=120, env={**env, "PROVMARK_HOME": str(stray)})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "holds another log key than the deployment's" in refused.stderr
