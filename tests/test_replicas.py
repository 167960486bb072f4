"""One provenance identity for a deployment of replicas: two generation and two detector services, each with
its own home, on one PostgreSQL, set up as docs/deploy.md says (one master key, `provmark identity init` once),
requests spread round robin. Every receipt verifies with joserfc from every replica's JWKS, every replica
publishes the same log key and C2PA anchor, the heads verify as C2SP signed notes with it, `provmark audit
verify` passes from every home, and a rotation on the admin machine reaches every replica without a restart."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from itertools import cycle
from pathlib import Path
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_fixtures import call, make_token, serve, shared_vocabulary
from joserfc import jws as jose_jws
from joserfc.jwk import KeySet

from api.detector.app import create_app as create_detector
from api.generation.app import create_app as create_generation
from db.identity import REFRESH_S
from db.store import Store
from provenance.identity import IdentityError
from provenance.log_signer import LogSigner
from watermark.keyring_seal import MASTER_KEY_ENV, format_master_key
from watermark.keys import Keyring

pytest_plugins = ["pg"]
pytestmark = pytest.mark.slow  # loads the embedded model
REPO = Path(__file__).resolve().parent.parent
MASTER_KEY = format_master_key(bytes(range(100, 132)))
GENERATIONS = 6
PROMPTS = ("Write two sentences about rivers.", "Describe a quiet library.", "Say something about winter.")


def cli(*args: str, home: Path, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PROVMARK_HOME": str(home), "PROVMARK_DATABASE_URL": url,
           MASTER_KEY_ENV: MASTER_KEY}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180, check=False)


def b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def note_verifies(checkpoint: str, public_raw: bytes) -> bool:
    """A C2SP signed note (tlog-checkpoint) checked from the spec alone: the line by the key's name and hash."""
    body, _, signatures = checkpoint.rpartition("\n\n")
    body += "\n"
    origin = body.split("\n", 1)[0]
    key_hash = hashlib.sha256(origin.encode() + b"\n\x01" + public_raw).digest()[:4]
    for line in signatures.strip("\n").split("\n"):
        _, name, blob = line.split(" ")
        raw = base64.b64decode(blob)
        if name == origin and raw[:4] == key_hash:
            try:
                Ed25519PublicKey.from_public_bytes(public_raw).verify(raw[4:], body.encode())
                return True
            except Exception:
                return False
    return False


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, loaded, pg_server):
    from generation.engine import Engine

    url = pg_server.create_database()
    root = tmp_path_factory.mktemp("deployment")
    os.environ[MASTER_KEY_ENV] = MASTER_KEY  # every replica's secret store injects the same master key
    admin = root / "admin"
    made = cli("identity", "init", "--json", home=admin, url=url)
    assert made.returncode == 0, made.stderr
    Keyring(admin).create("k-replicas")
    homes = {name: root / name for name in ("gen-a", "gen-b", "det-a", "det-b")}
    for name, home in homes.items():  # keyring.json shipped like configuration; nothing else is copied
        home.mkdir()
        (home / "keyring.json").write_bytes((admin / "keyring.json").read_bytes())
    engine = Engine(loaded, max_num_seqs=4, max_model_len=256)
    generators = [create_generation({"home": homes[n], "engine": engine, "rate_limit": 0, "database_url": url,
                                     "log_head_interval": 0.5}) for n in ("gen-a", "gen-b")]
    detectors = [create_detector({"home": homes[n], "vocab": shared_vocabulary(), "rate_limit": 0,
                                  "database_url": url}) for n in ("det-a", "det-b")]
    store = Store(url=url)
    with serve(generators[0]) as g1, serve(generators[1]) as g2, serve(detectors[0]) as d1, \
            serve(detectors[1]) as d2:
        yield SimpleNamespace(url=url, admin=admin, homes=homes, gens=[g1, g2], dets=[d1, d2], store=store,
                              identity=json.loads(made.stdout), generate=make_token(store, "generate"),
                              detect=make_token(store, "detect"), auditor=make_token(store, "audit", "explain"))
    for app in generators:
        app.extensions["provmark.log_heads"].stop()
        app.extensions["provmark.generation"].worker.stop()
    store.close()
    os.environ.pop(MASTER_KEY_ENV, None)


def generate_round_robin(deployment, count: int) -> list[dict]:
    answers, bases = [], cycle(deployment.gens)
    for i in range(count):
        request = {"prompt": PROMPTS[i % len(PROMPTS)], "max_new_tokens": 24, "min_new_tokens": 24, "seed": i}
        status, body, _ = call("POST", next(bases) + "/v1/generate", request, token=deployment.generate, timeout=300)
        assert status == 200, body
        answers.append(body)
    return answers


def test_every_replica_publishes_one_identity_and_verifies_every_other_replicas_output(deployment):
    everyone = deployment.gens + deployment.dets
    jwks_documents = [call("GET", base + "/.well-known/jwks.json")[1] for base in everyone]
    assert all(document == jwks_documents[0] for document in jwks_documents) and jwks_documents[0]["keys"]
    log_keys = [call("GET", base + "/v1/log/public-key")[1] for base in deployment.dets]
    assert log_keys[0] == log_keys[1]
    anchors = [call("GET", base + "/v1/c2pa/trust-anchors")[1] for base in everyone]
    assert all(anchor == anchors[0] for anchor in anchors) and "BEGIN CERTIFICATE" in str(anchors[0])
    for home in deployment.homes.values():  # no replica made keys of its own
        assert not list(home.glob("*.key")) and not (home / "c2pa").exists()

    answers = generate_round_robin(deployment, GENERATIONS)
    for answer in answers:  # joserfc, from every replica's JWKS
        for document in jwks_documents:
            verified = jose_jws.deserialize_compact(answer["receipt"]["jws"], KeySet.import_key_set(document),
                                                    algorithms=["Ed25519"])
            assert json.loads(verified.payload)["receipt_id"] == answer["receipt"]["receipt_id"]
    for answer, detector in zip(answers, cycle(deployment.dets)):  # any detector resolves any replica's output
        with urllib.request.urlopen(detector + "/v1/manifests/" + answer["c2pa"]["manifest_id"], timeout=30) as got:
            manifest = base64.b64encode(got.read()).decode()
        status, verdict, _ = call("POST", detector + "/v1/detect", {"text": answer["text"], "manifest": manifest},
                                  token=deployment.detect)
        assert status == 200 and verdict["provenance"]["receipt_id"] == answer["receipt"]["receipt_id"], verdict
        assert verdict["credentials"]["trusted"] is True, verdict["credentials"]

    time.sleep(1.5)  # the generation replicas sign a head every 0.5 s while the log grows
    public_raw = b64url(log_keys[0]["jwk"]["x"])
    heads = [call("GET", base + "/v1/log/head")[1] for base in deployment.dets]
    for head in heads:
        assert note_verifies(head["checkpoint"], public_raw), head
    small, large = sorted(heads, key=lambda head: head["tree_size"])
    if small["tree_size"] < large["tree_size"]:
        status, bundle, _ = call("GET", deployment.dets[0] + f"/v1/log/proof/consistency?first={small['tree_size']}"
                                 f"&second={large['tree_size']}", token=deployment.auditor)
        assert status == 200 and bundle["first_head"]["root_hash"] == small["root_hash"]
    for name in ("admin", *deployment.homes):
        home = deployment.admin if name == "admin" else deployment.homes[name]
        checked = cli("audit", "verify", "--json", home=home, url=deployment.url)
        report = json.loads(checked.stdout)
        assert checked.returncode == 0 and report["ok"] and report["tree_heads_checked"] >= 1, (name, checked.stdout)


def test_a_rotation_on_the_admin_machine_reaches_every_replica_without_a_restart(deployment):
    before = call("GET", deployment.dets[0] + "/.well-known/jwks.json")[1]
    rotated = cli("receipts", "rotate-key", "--json", home=deployment.admin, url=deployment.url)
    assert rotated.returncode == 0, rotated.stderr
    current = json.loads(rotated.stdout)["current"]["kid"]
    answers = generate_round_robin(deployment, 2)  # one from each generation replica, right after
    for answer in answers:
        assert jose_jws.extract_compact(answer["receipt"]["jws"].encode()).headers()["kid"] == current
    time.sleep(REFRESH_S + 0.5)
    for base in deployment.gens + deployment.dets:
        keys = call("GET", base + "/.well-known/jwks.json")[1]["keys"]
        assert keys[0]["kid"] == current and len(keys) == len(before["keys"]) + 1
        assert keys[1]["retired_at"] and keys[1]["kid"] == before["keys"][0]["kid"]


def test_a_replica_pointed_at_another_deployment_refuses_to_start(deployment, tmp_path):
    assert deployment.identity["deployment_id"] != "0123456789abcdef"
    with pytest.raises(IdentityError, match="another identity than the database's"):
        create_detector({"home": tmp_path / "stray", "vocab": shared_vocabulary(), "database_url": deployment.url,
                         "identity": "0123456789abcdef"})
    stray = tmp_path / "stray-keys"  # a home that kept a key file of its own (an older single-machine install)
    LogSigner(stray)
    with pytest.raises(IdentityError, match="holds another log key"):
        create_detector({"home": stray, "vocab": shared_vocabulary(), "database_url": deployment.url})
    assert call("GET", deployment.dets[0] + "/healthz")[0] == 200  # the deployment still answers
