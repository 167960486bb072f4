"""A manifest signed with PROVMARK_C2PA_TSA_URL carries an RFC 3161 time-stamp that c2pa's Reader validates:
the time-stamp authority here is OpenSSL's (`openssl ts -reply`) behind a loopback HTTP server, with its own
root, as a production TSA would be. Needs the `openssl` command (Debian's openssl; .ci/run installs it)."""

import datetime as dt
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import c2pa
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from http_fixtures import serve
from identity_fixtures import signing_keys_for
from werkzeug.wrappers import Request, Response

from api.provenance_keys import development_ca
from db.store import Store
from provenance.c2pa_credential import load_c2pa_credential
from provenance.c2pa_manifest import TextClaims, sign_text

TEXT = "A paragraph the service signed, with the time a third party vouches for."
CLAIMS = TextClaims("smollm2-135m-instruct", "00000000-0000-4000-8000-0000000000aa", "http://127.0.0.1:8000",
                    "http://127.0.0.1:8001")
TSA_CONFIG = """[ tsa ]
default_tsa = tsa_config1
[ tsa_config1 ]
serial = {folder}/serial
signer_cert = {folder}/tsa.pem
certs = {folder}/root.pem
signer_key = {folder}/tsa.key
signer_digest = sha256
default_policy = 1.2.3.4.1
digests = sha256, sha384, sha512
accuracy = secs:1
ess_cert_id_alg = sha256
"""


def _certificate(subject: str, key, issuer, issuer_key, *, ca: bool) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer.subject if issuer else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
    else:
        usage = x509.KeyUsage(True, False, False, False, False, False, False, False, False)
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True)
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                                        critical=False)
    return builder.add_extension(usage, critical=True).sign(issuer_key, hashes.SHA256())


@pytest.fixture
def tsa(tmp_path):
    """An RFC 3161 time-stamp authority on a loopback port; yields (its URL, its root PEM)."""
    if shutil.which("openssl") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the openssl command is missing and CI=true (apt-get install openssl)")
        pytest.skip("the openssl command is missing")
    folder = tmp_path / "tsa"
    folder.mkdir()
    root_key, tsa_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    root = _certificate("test TSA root", root_key, None, root_key, ca=True)
    (folder / "root.pem").write_bytes(root.public_bytes(serialization.Encoding.PEM))
    (folder / "tsa.pem").write_bytes(
        _certificate("test TSA", tsa_key, root, root_key, ca=False).public_bytes(serialization.Encoding.PEM))
    (folder / "tsa.key").write_bytes(tsa_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    (folder / "serial").write_text("01\n")
    (folder / "tsa.cnf").write_text(TSA_CONFIG.format(folder=folder))
    answered = []

    @Request.application
    def reply(request: Request) -> Response:
        with tempfile.TemporaryDirectory() as work:
            query, answer = Path(work) / "query.tsq", Path(work) / "reply.tsr"
            query.write_bytes(request.get_data())
            subprocess.run(["openssl", "ts", "-reply", "-config", str(folder / "tsa.cnf"), "-queryfile", str(query),
                            "-out", str(answer)], check=True, capture_output=True, timeout=30)
            answered.append(request.headers.get("Content-Type"))
            return Response(answer.read_bytes(), mimetype="application/timestamp-reply")

    with serve(reply) as url:
        yield url + "/", (folder / "root.pem").read_text(), answered


def test_a_manifest_signed_with_a_tsa_carries_a_time_stamp_the_reader_trusts(tsa, provmark_home):
    url, tsa_root, answered = tsa
    store = Store(home=provmark_home)
    keys = signing_keys_for(store, provmark_home, c2pa_tsa_url=url)
    credential = keys.c2pa
    assert credential.tsa_url == url.rstrip("/")
    signed = sign_text(credential, TEXT, CLAIMS)
    assert answered == ["application/timestamp-query"]  # c2pa-rs asked the authority once, RFC 3161's way
    context = c2pa.Context.from_dict({"verify": {"verify_trust": True},
                                      "trust": {"trust_anchors": credential.trust_anchors_pem + tsa_root}})
    with c2pa.Reader("text/plain", io.BytesIO(TEXT.encode()), manifest_data=signed.manifest_store,
                     context=context) as reader:
        state, results = reader.get_validation_state(), reader.get_validation_results()["activeManifest"]
    codes = {item["code"] for item in results["success"]}
    assert state == "Trusted" and {"timeStamp.validated", "timeStamp.trusted"} <= codes, results
    unstamped = sign_text(load_c2pa_credential(development=development_ca(store, keys.seal)), TEXT, CLAIMS)
    store.close()
    with c2pa.Reader("text/plain", io.BytesIO(TEXT.encode()), manifest_data=unstamped.manifest_store,
                     context=context) as reader:
        plain = {item["code"] for item in reader.get_validation_results()["activeManifest"]["success"]}
    assert not plain & {"timeStamp.validated", "timeStamp.trusted"}  # the stamp comes from the authority alone
