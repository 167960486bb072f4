"""JWS receipts: checked by JOSE code that is not provmark's (joserfc directly, and a bare Ed25519 check with
`cryptography`), against the JWKS; rotation keeps old receipts verifiable; the CLI verifies offline."""

import base64
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from identity_fixtures import signing_keys_for
from joserfc import jws as jose_jws
from joserfc.errors import BadSignatureError
from joserfc.jwk import KeySet
from sqlalchemy import insert

from api.cli.main import main
from db.audit import verify
from db.receipts import (
    ReceiptError,
    ReceiptLinks,
    get_receipt,
    issue_receipt,
    legacy_key_in,
    sign_receipt,
    verify_legacy_receipt,
    verify_receipt,
    verify_receipt_jws,
)
from db.rows import ReceiptRow, SigningKeyRow, text_sha256
from db.store import Store
from provenance.identity import IdentityError
from watermark.keyring_seal import MASTER_KEY_ENV, format_master_key

REPO = Path(__file__).resolve().parent.parent
TEXT = "The lighthouse keeper climbed the stairs at dusk."
FIELDS = {"text_sha256": text_sha256(TEXT), "token_count": 12, "model_id": "smollm2-135m-instruct",
          "spec_fingerprint": "0123456789abcdef", "key_id": "k-main"}
LINKS = ReceiptLinks(issuer="https://gen.example", detector="https://detect.example",
                     spec="kgw:scheme=selfhash,h=4", c2pa_manifest_id="urn:c2pa:7c0a3b0e-0000-4000-8000-000000000001")


def b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


@pytest.fixture(autouse=True)
def deployment_master_key(monkeypatch):
    """Every replica of a deployment has its master key (PROVMARK_MASTER_KEY), as docs/deploy.md says."""
    monkeypatch.setenv(MASTER_KEY_ENV, format_master_key(bytes(range(32))))


def jwks_document(signer) -> dict:
    return {"keys": signer.jwks_keys()}


@pytest.fixture
def signer(home_store, provmark_home):
    return signing_keys_for(home_store, provmark_home).receipts


def other_deployment(tmp_path, name: str):
    """The receipt signer of another deployment (its own database and master key)."""
    home = tmp_path / name
    return signing_keys_for(Store(home=home), home).receipts


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
    other = other_deployment(tmp_path, "other-home")
    with pytest.raises(ReceiptError, match="not in the JWKS"):
        verify_receipt_jws(token, jwks_document(other))
    assert verify_receipt_jws(token, jwks)["receipt_id"] == claims["receipt_id"]


def test_after_a_rotation_old_and_new_receipts_verify_and_the_jwks_lists_both(signer, home_store, tmp_path):
    store = home_store
    old = issue_receipt(store, signer, "test", **FIELDS)
    replica_home = tmp_path / "replica"  # another replica: its own home, the same database and master key
    in_another_replica = signing_keys_for(store, replica_home).receipts
    rotated = signer.rotate(store, "test")
    new = issue_receipt(store, in_another_replica, "test", **FIELDS)  # it notices the rotation before storing
    jwks = jwks_document(in_another_replica)
    kids = [key["kid"] for key in jwks["keys"]]
    assert kids == [rotated["current"]["kid"], rotated["retired"]["kid"]]
    assert "retired_at" in jwks["keys"][1] and "retired_at" not in jwks["keys"][0]
    for receipt, kid in ((old, rotated["retired"]["kid"]), (new, rotated["current"]["kid"])):
        assert verify_receipt_jws(receipt["jws"], jwks)["receipt_id"] == receipt["receipt_id"]
        assert jose_jws.extract_compact(receipt["jws"].encode()).headers()["kid"] == kid
    assert verify(store).ok  # the rotation is an audit event of the chain


def test_a_retired_key_signing_after_its_retirement_is_refused(signer, home_store, tmp_path):
    before = sign_receipt(signer, **FIELDS)
    leaked = signing_keys_for(home_store, tmp_path / "replica").receipts  # holds the key before the rotation
    signer.rotate(home_store, "test")
    after = sign_receipt(leaked, **FIELDS)  # the old key, used after its retirement (a leaked copy, say)
    jwks = jwks_document(signer)
    assert verify_receipt_jws(before["jws"], jwks)["receipt_id"] == before["receipt_id"]
    with pytest.raises(ReceiptError, match="after its key .* was retired"):
        verify_receipt_jws(after["jws"], jwks)
    legacy_after = {name: value for name, value in after.items() if name != "jws"}
    with pytest.raises(ReceiptError, match="after its key .* was retired"):
        verify_legacy_receipt(legacy_after, jwks)
    # a joserfc user sees a valid signature: the JWKS's retired_at is what says no, and it is there
    retired = next(key for key in jwks["keys"] if "retired_at" in key)
    assert retired["retired_at"] < after["created_at"]


def test_a_retired_key_list_cannot_be_grown_without_the_master_key(signer, home_store, provmark_home):
    with home_store.write() as session:  # a forged retired key, written straight into the table
        session.execute(insert(SigningKeyRow).values(
            role="receipt", kid="forged", public_key=base64.b64encode(bytes(32)).decode(),
            created_at="2020-01-01T00:00:00Z", retired_at="2030-01-01T00:00:00Z", mac="0" * 64))
    with pytest.raises(IdentityError, match="authentication"):
        signer.jwks_keys()
    with pytest.raises(IdentityError, match="authentication"):
        signing_keys_for(home_store, provmark_home)


def test_legacy_receipts_verify_with_the_jwks_key_their_signer_id_names(signer):
    receipt = sign_receipt(signer, **FIELDS, links=LINKS)
    legacy = {name: value for name, value in receipt.items() if name != "jws"}
    key, _ = legacy_key_in(jwks_document(signer), legacy["signer_id"])
    assert verify_receipt(legacy, key)
    assert not verify_receipt({**legacy, "token_count": 13}, key)
    shown = verify_legacy_receipt({**legacy, "iss": "https://forged.example", "c2pa_manifest_id": "urn:x"},
                                  jwks_document(signer))
    assert set(shown) == set(FIELDS) | {"created_at", "receipt_id"}  # only what the signature covers
    with pytest.raises(ReceiptError, match="signer id"):
        legacy_key_in(jwks_document(signer), "0000000000000000")


def test_a_stored_receipt_keeps_its_jws_and_an_edit_to_it_is_caught(signer, home_store):
    store = home_store
    receipt = issue_receipt(store, signer, "test", **FIELDS, links=LINKS)
    assert get_receipt(store, receipt["receipt_id"])["jws"] == receipt["jws"]
    assert verify(store).ok
    with store.write() as session:
        session.get(ReceiptRow, receipt["receipt_id"]).jws = sign_receipt(signer, **FIELDS)["jws"]
    report = verify(store)
    assert [problem.problem for problem in report.problems] == ["row_edited"]


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
    other_jwks.write_text(json.dumps(jwks_document(other_deployment(tmp_path, "elsewhere"))))
    wrong_key = run_main(capsys, "receipts", "verify", str(tmp_path / "response.json"), "--jwks", str(other_jwks))
    assert wrong_key.returncode == 1 and "not in the JWKS" in wrong_key.stdout
    garbage = run_main(capsys, "receipts", "verify", str(tmp_path / "text.txt"), "--jwks", str(tmp_path / "jwks.json"))
    assert garbage.returncode == 1 and "not a compact JWS" in garbage.stdout
    missing = run_main(capsys, "receipts", "verify", str(tmp_path / "nope.json"), "--jwks", str(tmp_path / "jwks.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def serving(document: dict):
    """A JWKS served over plain HTTP on 127.0.0.1 (a local service): (server, its origin)."""
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_the_cli_refuses_a_plain_http_jwks_and_checks_the_issuer_against_its_origin(signer, tmp_path, capsys):
    server, origin = serving(jwks_document(signer))
    try:
        url = origin + "/.well-known/jwks.json"
        ours = sign_receipt(signer, **FIELDS, links=ReceiptLinks(issuer=origin))
        theirs = sign_receipt(signer, **FIELDS, links=LINKS)  # says it comes from https://gen.example
        (tmp_path / "ours.json").write_text(json.dumps({"receipt": ours}))
        (tmp_path / "theirs.json").write_text(json.dumps({"receipt": theirs}))
        refused = run_main(capsys, "receipts", "verify", str(tmp_path / "ours.json"), "--jwks", url)
        assert refused.returncode == 2 and "plain http" in refused.stderr
        ok = run_main(capsys, "receipts", "verify", str(tmp_path / "ours.json"), "--jwks", url, "--allow-http",
                      "--json")
        assert ok.returncode == 0 and json.loads(ok.stdout)["issuer_checked"] is True, ok.stdout
        via_detector = sign_receipt(signer, **FIELDS, links=ReceiptLinks(issuer="https://gen.example",
                                                                          detector=origin))
        (tmp_path / "via-detector.json").write_text(json.dumps({"receipt": via_detector}))
        named = run_main(capsys, "receipts", "verify", str(tmp_path / "via-detector.json"), "--jwks", url,
                         "--allow-http", "--json")  # the detector the signed receipt names serves its JWKS too
        assert named.returncode == 0 and json.loads(named.stdout)["issuer_checked"] is True, named.stdout
        elsewhere = run_main(capsys, "receipts", "verify", str(tmp_path / "theirs.json"), "--jwks", url,
                             "--allow-http")
        assert elsewhere.returncode == 1 and "is not" in elsewhere.stdout and "https://gen.example" in elsewhere.stdout
    finally:
        server.shutdown()
    (tmp_path / "jwks.json").write_text(json.dumps(jwks_document(signer)))
    from_file = run_main(capsys, "receipts", "verify", str(tmp_path / "theirs.json"), "--jwks",
                         str(tmp_path / "jwks.json"))
    assert from_file.returncode == 0 and "issuer was not checked" in from_file.stdout


def test_the_cli_shows_a_legacy_receipt_only_as_far_as_its_signature_covers(signer, tmp_path, capsys):
    receipt = sign_receipt(signer, **FIELDS, links=LINKS)
    legacy = {name: value for name, value in receipt.items() if name != "jws"}
    legacy.update(iss="https://forged.example", c2pa_manifest_id="urn:c2pa:forged")  # unsigned additions
    (tmp_path / "legacy.json").write_text(json.dumps(legacy))
    (tmp_path / "jwks.json").write_text(json.dumps(jwks_document(signer)))
    shown = run_main(capsys, "receipts", "verify", str(tmp_path / "legacy.json"), "--jwks",
                     str(tmp_path / "jwks.json"), "--json")
    result = json.loads(shown.stdout)
    assert shown.returncode == 0 and result["form"] == "legacy"
    assert "iss" not in result["receipt"] and "c2pa_manifest_id" not in result["receipt"]
    assert result["receipt"]["receipt_id"] == receipt["receipt_id"]
