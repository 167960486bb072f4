"""Ed25519 generation receipts: offline verification, tamper failure, the sealed key in the database, storage."""

import base64
import json
import secrets

import pytest
from cryptography.hazmat.primitives import serialization
from identity_fixtures import signing_keys_for
from sqlalchemy import select, update

from db.audit import list_events, verify
from db.identity import seal_of
from db.receipts import (
    SIGNED_FIELDS,
    ReceiptError,
    ReceiptSigner,
    find_receipt_by_text_sha256,
    get_receipt,
    issue_receipt,
    sign_receipt,
    verify_receipt,
)
from db.rows import SigningKeyRow, text_sha256
from db.store import Store
from provenance.identity import IdentityError
from watermark.keyring_seal import MASTER_KEY_ENV, format_master_key

pytest_plugins = ["pg"]

FIELDS = {"text_sha256": text_sha256("a generated story"), "token_count": 42,
          "model_id": "smollm2-135m-instruct", "spec_fingerprint": "0123456789abcdef", "key_id": "k-main"}
CHANGED = {"text_sha256": text_sha256("another story"), "token_count": 43, "model_id": "other-model",
           "spec_fingerprint": "fedcba9876543210", "key_id": "k-other",
           "created_at": "2020-01-01T00:00:00.000000Z",
           "receipt_id": "00000000-0000-0000-0000-000000000000"}


@pytest.fixture
def signer(home_store, provmark_home):
    return signing_keys_for(home_store, provmark_home).receipts


def test_receipt_verifies_offline_with_the_public_key_in_any_form(signer):
    receipt = json.loads(json.dumps(sign_receipt(signer, **FIELDS)))  # through JSON, as a client gets it
    pem, raw_b64 = signer.public_key_pem(), signer.public_key_b64()
    assert pem.startswith("-----BEGIN PUBLIC KEY-----")
    for public_key in (pem, pem.encode(), raw_b64, base64.b64decode(raw_b64), signer.public_key):
        assert verify_receipt(receipt, public_key)
    assert set(SIGNED_FIELDS) | {"signature", "signer_id", "algorithm", "jws"} == set(receipt)


@pytest.mark.parametrize("name", SIGNED_FIELDS)
def test_changing_any_signed_field_breaks_the_signature(signer, name):
    receipt = sign_receipt(signer, **FIELDS)
    assert verify_receipt(receipt, signer.public_key)
    assert not verify_receipt({**receipt, name: CHANGED[name]}, signer.public_key)


def test_changed_signature_type_or_signer_fails(signer, tmp_path):
    receipt = sign_receipt(signer, **FIELDS)
    signature = bytearray(base64.b64decode(receipt["signature"]))
    signature[0] ^= 1
    flipped = base64.b64encode(bytes(signature)).decode()
    assert not verify_receipt({**receipt, "signature": flipped}, signer.public_key)
    assert not verify_receipt({**receipt, "token_count": "42"}, signer.public_key)  # other JSON type
    assert not verify_receipt({**receipt, "signature": "not base64!"}, signer.public_key)
    assert not verify_receipt({k: v for k, v in receipt.items() if k != "model_id"}, signer.public_key)
    other_store = Store(home=tmp_path / "other-home")
    other = signing_keys_for(other_store, tmp_path / "other-home").receipts
    assert not verify_receipt(receipt, other.public_key)
    other_store.close()


def test_the_signing_key_is_sealed_in_the_database_and_stable(signer, home_store, provmark_home):
    with home_store.read() as session:
        rows = session.scalars(select(SigningKeyRow)).all()
    content = json.dumps([[getattr(row, c) for c in ("kid", "public_key", "certificate", "sealed", "mac")]
                          for row in rows]).encode()
    raw_private = signer._key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    assert raw_private not in content
    for encoder in (base64.b64encode, base64.urlsafe_b64encode, base64.b16encode):
        assert encoder(raw_private).rstrip(b"=") not in content
    assert raw_private.hex().encode() not in content and b"PRIVATE KEY" not in content
    assert ReceiptSigner(home_store, seal_of(provmark_home)).signer_id == signer.signer_id  # loaded, not remade
    assert (provmark_home / "master.key").exists()  # the keyring's master key sealed it
    assert not (provmark_home / "receipt-signing.key").exists()  # no replica keeps its own key file


def test_wrong_master_key_or_edited_row_is_refused(signer, home_store, provmark_home, monkeypatch):
    monkeypatch.setenv(MASTER_KEY_ENV, format_master_key(secrets.token_bytes(32)))
    with pytest.raises(ReceiptError, match="another master key"):
        ReceiptSigner(home_store, seal_of(provmark_home))
    monkeypatch.delenv(MASTER_KEY_ENV)
    intruder = base64.b64encode(bytes(32)).decode()
    with home_store.write() as session:  # someone with write access to the table, without the master key
        session.execute(update(SigningKeyRow).where(SigningKeyRow.role == "receipt").values(public_key=intruder))
    with pytest.raises(ReceiptError, match="authentication"):
        ReceiptSigner(home_store, seal_of(provmark_home))
    with pytest.raises(IdentityError, match="authentication"):
        signing_keys_for(home_store, provmark_home)


def test_master_key_from_environment_is_used(home_store, provmark_home, monkeypatch):
    monkeypatch.setenv(MASTER_KEY_ENV, format_master_key(bytes(range(32))))
    first = signing_keys_for(home_store, provmark_home).receipts
    assert not (provmark_home / "master.key").exists()
    assert ReceiptSigner(home_store, seal_of(provmark_home)).signer_id == first.signer_id


@pytest.mark.parametrize(("name", "value"), [("text_sha256", "xyz"), ("token_count", -1), ("model_id", ""),
                                             ("key_id", "Bad Id"), ("created_at", "yesterday")])
def test_fields_are_validated_by_name(signer, name, value):
    with pytest.raises((ReceiptError, ValueError), match=name.replace("_", "[_ ]")):
        sign_receipt(signer, **{**FIELDS, name: value})


def test_receipts_are_stored_audited_and_found_by_text_hash(database_url, provmark_home):
    store = Store(url=database_url)
    signer = signing_keys_for(store, provmark_home).receipts
    receipt = issue_receipt(store, signer, "token:gen-1", **FIELDS)
    found = find_receipt_by_text_sha256(store, FIELDS["text_sha256"])
    assert found == receipt and get_receipt(store, receipt["receipt_id"]) == receipt
    assert verify_receipt(found, signer.public_key_pem())
    assert find_receipt_by_text_sha256(store, text_sha256("never generated")) is None
    created, event = list_events(store)
    assert created.kind == "key.identity_create"
    assert (event.kind, event.subject_id, event.actor) == ("generation", receipt["receipt_id"], "token:gen-1")
    assert verify(store).ok
    store.close()
