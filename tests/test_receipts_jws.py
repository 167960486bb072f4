"""JWS receipts: checked by JOSE code that is not provmark's (joserfc directly, and a bare Ed25519 check with
`cryptography`), against the JWKS; rotation keeps old receipts verifiable; the CLI verifies offline."""

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from joserfc import jws as jose_jws
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet

from api.cli.main import main
from api.provenance_keys import jwks_document
from db.audit import verify
from db.receipts import (
    ReceiptError,
    ReceiptLinks,
    ReceiptSigner,
    get_receipt,
    issue_receipt,
    legacy_key_in,
    sign_receipt,
    verify_receipt,
    verify_receipt_jws,
)
from db.rows import ReceiptRow, text_sha256
from db.store import Store

REPO = Path(__file__).resolve().parent.parent
TEXT = "The lighthouse keeper climbed the stairs at dusk."
FIELDS = {"text_sha256": text_sha256(TEXT), "token_count": 12, "model_id": "smollm2-135m-instruct",
          "spec_fingerprint": "0123456789abcdef", "key_id": "k-main"}
LINKS = ReceiptLinks(issuer="https://gen.example", detector="https://detect.example",
                     spec="kgw:scheme=selfhash,h=4", c2pa_manifest_id="urn:c2pa:7c0a3b0e-0000-4000-8000-000000000001")


def b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


@pytest.fixture
def signer(provmark_home):
    return ReceiptSigner(provmark_home)


def test_a_receipt_verifies_with_joserfc_and_with_a_bare_ed25519_check_from_the_jwks(signer):
    receipt = sign_receipt(signer, **FIELDS, links=LINKS)
    jwks = json.loads(json.dumps(jwks_document(signer)))  # as a verifier downloads it
    token = receipt["jws"]
    # joserfc, told the algorithm (RFC 9864's Ed25519), picks the key by kid from the JWKS
    verified = jose_jws.deserialize_compact(token, KeySet.import_key_set(jwks), algorithms=["Ed25519"])
    header, claims = verified.headers(), json.loads(verified.payload)
    assert header == {"alg": "Ed25519", "kid": jwks["keys"][0]["kid"], "typ": "provmark-receipt+jwt"}
    assert claims["jti"] == receipt["receipt_id"] == claims["receipt_id"]
    assert claims["iss"] == "https://gen.example" and claims["detector"] == "https://detect.example"
    assert claims["c2pa_manifest_id"] == LINKS.c2pa_manifest_id and claims["spec"] == LINKS.spec
    assert {name: claims[name] for name in FIELDS} == FIELDS and isinstance(claims["iat"], int)
    # the same check by hand: Ed25519 over "header.payload" with the JWK's raw x
    signing_input, _, signature = token.rpartition(".")
    key = Ed25519PublicKey.from_public_bytes(b64url(jwks["keys"][0]["x"]))
    key.verify(b64url(signature), signing_input.encode())
    assert jwks["keys"][0] == {"kty": "OKP", "crv": "Ed25519", "x": jwks["keys"][0]["x"],
                               "kid": jwks["keys"][0]["kid"], "alg": "Ed25519", "use": "sig"}


def test_a_changed_payload_or_a_key_not_in_the_jwks_fails(signer, tmp_path):
    token = sign_receipt(signer, **FIELDS, links=LINKS)["jws"]
    jwks = jwks_document(signer)
    head, payload, signature = token.split(".")
    claims = json.loads(b64url(payload))
    claims["token_count"] += 1
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    forged = f"{head}.{forged_payload}.{signature}"
    with pytest.raises(BadSignatureError):
        jose_jws.deserialize_compact(forged, KeySet.import_key_set(jwks), algorithms=["Ed25519"])
    with pytest.raises(InvalidSignature):
        Ed25519PublicKey.from_public_bytes(b64url(jwks["keys"][0]["x"])).verify(
            b64url(signature), f"{head}.{forged_payload}".encode())
    with pytest.raises(ReceiptError, match="signature does not verify"):
        verify_receipt_jws(forged, jwks)
    other = ReceiptSigner(tmp_path / "other-home")
    with pytest.raises(ReceiptError, match="not in the JWKS"):
        verify_receipt_jws(token, jwks_document(other))
    assert verify_receipt_jws(token, jwks)["receipt_id"] == claims["receipt_id"]


def test_after_a_rotation_old_and_new_receipts_verify_and_the_jwks_lists_both(signer, provmark_home):
    store = Store(home=provmark_home)
    store.upgrade()
    old = sign_receipt(signer, **FIELDS)
    in_another_process = ReceiptSigner(provmark_home)  # a service worker that loaded the key before
    rotated = signer.rotate(store, "test")
    new = sign_receipt(in_another_process, **FIELDS)  # it notices the rotation before signing
    jwks = jwks_document(ReceiptSigner(provmark_home))
    kids = [key["kid"] for key in jwks["keys"]]
    assert kids == [rotated["current"]["kid"], rotated["retired"]["kid"]]
    assert "retired_at" in jwks["keys"][1] and "retired_at" not in jwks["keys"][0]
    for receipt, kid in ((old, rotated["retired"]["kid"]), (new, rotated["current"]["kid"])):
        assert verify_receipt_jws(receipt["jws"], jwks)["receipt_id"] == receipt["receipt_id"]
        assert jose_jws.extract_compact(receipt["jws"].encode()).headers()["kid"] == kid
    assert verify(store).ok  # the rotation is an audit event of the chain
    store.close()


def test_legacy_receipts_verify_with_the_jwks_key_their_signer_id_names(signer):
    receipt = sign_receipt(signer, **FIELDS)
    legacy = {name: value for name, value in receipt.items() if name != "jws"}
    key = legacy_key_in(jwks_document(signer), legacy["signer_id"])
    assert verify_receipt(legacy, key)
    assert not verify_receipt({**legacy, "token_count": 13}, key)
    with pytest.raises(ReceiptError, match="signer id"):
        legacy_key_in(jwks_document(signer), "0000000000000000")


def test_a_stored_receipt_keeps_its_jws_and_an_edit_to_it_is_caught(signer, provmark_home):
    store = Store(home=provmark_home)
    store.upgrade()
    receipt = issue_receipt(store, signer, "test", **FIELDS, links=LINKS)
    assert get_receipt(store, receipt["receipt_id"])["jws"] == receipt["jws"]
    assert verify(store).ok
    with store.write() as session:
        session.get(ReceiptRow, receipt["receipt_id"]).jws = sign_receipt(signer, **FIELDS)["jws"]
    report = verify(store)
    assert [problem.problem for problem in report.problems] == ["row_edited"]
    store.close()


def run_cli(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, capture_output=True, text=True,
                          input=stdin, timeout=120)


def run_main(capsys, *args) -> subprocess.CompletedProcess:
    """The same command in this process (the subprocess runs above show the real entry point works)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out, err)


def test_the_cli_verifies_a_receipt_offline_and_says_why_when_it_does_not(signer, provmark_home, tmp_path, capsys):
    receipt = sign_receipt(signer, **FIELDS, links=LINKS)
    (tmp_path / "response.json").write_text(json.dumps({"text": TEXT, "receipt": receipt}))
    (tmp_path / "text.txt").write_text(TEXT)
    (tmp_path / "other.txt").write_text(TEXT + "!")
    jwks_out = run_cli("receipts", "jwks")
    assert jwks_out.returncode == 0, jwks_out.stderr
    (tmp_path / "jwks.json").write_text(jwks_out.stdout)
    ok = run_cli("receipts", "verify", str(tmp_path / "response.json"), "--jwks", str(tmp_path / "jwks.json"),
                 "--text", str(tmp_path / "text.txt"))
    assert ok.returncode == 0 and "verifies (jws)" in ok.stdout and "text matches" in ok.stdout, ok.stdout + ok.stderr
    bare = run_cli("receipts", "verify", "-", "--jwks", str(tmp_path / "jwks.json"), "--json", stdin=receipt["jws"])
    assert bare.returncode == 0 and json.loads(bare.stdout)["receipt"]["iss"] == "https://gen.example"
    wrong_text = run_main(capsys, "receipts", "verify", str(tmp_path / "response.json"), "--jwks",
                         str(tmp_path / "jwks.json"), "--text", str(tmp_path / "other.txt"))
    assert wrong_text.returncode == 1 and "does not hold the receipt's text" in wrong_text.stdout
    other_jwks = tmp_path / "other-jwks.json"
    other_jwks.write_text(json.dumps(jwks_document(ReceiptSigner(tmp_path / "elsewhere"))))
    wrong_key = run_main(capsys, "receipts", "verify", str(tmp_path / "response.json"), "--jwks", str(other_jwks))
    assert wrong_key.returncode == 1 and "not in the JWKS" in wrong_key.stdout
    garbage = run_main(capsys, "receipts", "verify", str(tmp_path / "text.txt"), "--jwks", str(tmp_path / "jwks.json"))
    assert garbage.returncode == 1 and "not a compact JWS" in garbage.stdout
    missing = run_main(capsys, "receipts", "verify", str(tmp_path / "nope.json"), "--jwks", str(tmp_path / "jwks.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
