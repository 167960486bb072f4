"""The log's witness: C2SP tlog-cosignature v1 over checkpoints (checked here by code written from the spec text,
with only hashlib and cryptography), the witness's decision, and ``provmark log witness`` run by an outsider
against a detector served over real HTTP, whose log is then grown, rewritten and rolled back under it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from http_fixtures import call, serve, shared_vocabulary
from identity_fixtures import signing_keys_for
from sqlalchemy import func, select, text

from api.cli import main
from api.detector.app import create_app, services_of
from db.audit import append_event, verify
from db.rows import AuditEventRow
from db.transparency import consistency_proof, inclusion_proof, keep_tree_head
from provenance import merkle
from provenance.log_key import parse_verifier_key, verifier_key
from provenance.log_signer import LogSigner
from provenance.tree_head import TreeHead, parse_checkpoint, sign_tree_head, verify_checkpoint, verify_tree_head
from provenance.witness import (
    FORK,
    INCONSISTENT,
    LOG_SIGNATURE,
    ORIGIN_CHANGED,
    ROLLBACK,
    Refusal,
    WitnessError,
    check_update,
    cosign,
    cosigned_message,
    merge_cosignatures,
    parse_witness_vkey,
    verify_cosignature,
    witness_update,
    witness_vkey,
)

pytest_plugins = ["pg"]

WITNESS_NAME = "witness.example.org/w1"
SEED = bytes(range(32))  # a fixed witness key, for the known answer below


def raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def spec_key_id(name: str, public_raw: bytes) -> bytes:
    """C2SP tlog-cosignature: key ID = SHA-256(<name> || "\\n" || 0x04 || 32-byte Ed25519 public key)[:4]."""
    return hashlib.sha256(name.encode() + b"\n" + b"\x04" + public_raw).digest()[:4]


def spec_check(note: str, name: str, public_raw: bytes) -> int:
    """The timestamp of the note's cosignature by ``name``, checked as the spec says; raises otherwise."""
    body, _, signatures = note.partition("\n\n")
    body += "\n"
    for line in signatures.split("\n")[:-1]:
        dash, signer, encoded = line.split(" ")
        blob = base64.b64decode(encoded)
        if dash == "\u2014" and signer == name and blob[:4] == spec_key_id(name, public_raw):
            assert len(blob) == 4 + 8 + 64
            stamp = int.from_bytes(blob[4:12], "big")
            message = b"cosignature/v1\n" + f"time {stamp}\n".encode() + body.encode()
            Ed25519PublicKey.from_public_bytes(public_raw).verify(blob[12:], message)
            return stamp
    raise AssertionError(f"no cosignature line by {name}")


def leaves(tag: str, count: int) -> list[bytes]:
    return [merkle.leaf_hash(f"{tag} {i}".encode()) for i in range(count)]


def head_of(log_key: Ed25519PrivateKey, tree: list[bytes], origin: str = "provmark.log/test") -> str:
    return sign_tree_head(log_key, origin, len(tree), merkle.root_hash(tree), 1_700_000_000_000).checkpoint


# ---- the cosignature -----------------------------------------------------------------------------------

def test_the_key_id_and_verifier_key_are_the_spec_s():
    key = Ed25519PrivateKey.from_private_bytes(SEED)
    public_raw = raw(key.public_key())
    key_id = spec_key_id(WITNESS_NAME, public_raw)
    assert key_id.hex() == "cfcd1a67"  # the formula above, on this fixed key: a change of encoding shows here
    typed_key = base64.b64encode(b"\x04" + public_raw).decode()
    assert witness_vkey(WITNESS_NAME, key.public_key()) == f"{WITNESS_NAME}+{key_id.hex()}+{typed_key}"
    name, parsed = parse_witness_vkey(witness_vkey(WITNESS_NAME, key.public_key()))
    assert name == WITNESS_NAME and raw(parsed) == public_raw
    wrong_id = f"{WITNESS_NAME}+{int.from_bytes(key_id, 'big') ^ 1:08x}+{typed_key}"
    log_typed = f"{WITNESS_NAME}+{key_id.hex()}+" + base64.b64encode(b"\x01" + public_raw).decode()  # a log's type
    for bad in (wrong_id, log_typed, "no-plus-signs", f"two words+{key_id.hex()}+{typed_key}"):
        with pytest.raises(WitnessError):
            parse_witness_vkey(bad)


SPEC_EXAMPLE = """example.com/behind-the-sofa
20852163
CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=

\u2014 example.com/behind-the-sofa Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=
\u2014 witness.example.com/w1 jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==
"""  # the cosigned checkpoint of C2SP tlog-cosignature's introduction; its Ed25519 signed message example is:
SPEC_MESSAGE = b"cosignature/v1\ntime 1679315147\nexample.com/behind-the-sofa\n20852163\n" \
    b"CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"


def test_the_spec_s_example_note_reads_and_its_signed_message_is_ours():
    """The spec publishes no witness key, so its cosignature cannot be verified here: its layout and message can."""
    checkpoint = parse_checkpoint(SPEC_EXAMPLE)
    assert (checkpoint.origin, checkpoint.tree_size) == ("example.com/behind-the-sofa", 20852163)
    (log_name, _, _), (witness, key_id, rest) = checkpoint.signatures
    assert (log_name, witness, len(key_id) + len(rest)) == ("example.com/behind-the-sofa", "witness.example.com/w1", 76)
    stamp = int.from_bytes(rest[:8], "big")
    assert stamp == 1679315147 and cosigned_message(checkpoint.body, stamp) == SPEC_MESSAGE
    with pytest.raises(WitnessError, match="no cosignature by witness"):  # another key: another key id
        verify_cosignature(SPEC_EXAMPLE, witness, Ed25519PrivateKey.generate().public_key())


def test_verifier_keys_whose_base64_holds_a_plus_read_back():
    """A name has no '+', base64 may (about half of all keys): both kinds of verifier key split at the first two."""
    pluses = 0
    for i in range(16):
        public = Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32).public_key()
        for vkey, parse in ((witness_vkey(WITNESS_NAME, public), parse_witness_vkey),
                            (verifier_key(WITNESS_NAME, public), parse_verifier_key)):
            pluses += "+" in vkey.split("+", 2)[2]
            name, parsed = parse(vkey)
            assert name == WITNESS_NAME and raw(parsed) == raw(public)
    assert pluses >= 4


def test_a_cosignature_verifies_by_the_spec_and_tampering_is_refused():
    log_key, witness = Ed25519PrivateKey.generate(), Ed25519PrivateKey.from_private_bytes(SEED)
    head = sign_tree_head(log_key, "provmark.log/test", 5, merkle.root_hash(leaves("a", 5)), 1_700_000_000_000)
    cosigned = cosign(head.checkpoint, WITNESS_NAME, witness, timestamp=1_700_000_123)
    assert cosigned.startswith(head.checkpoint) and cosigned.count("\n") == head.checkpoint.count("\n") + 1
    assert spec_check(cosigned, WITNESS_NAME, raw(witness.public_key())) == 1_700_000_123
    assert verify_cosignature(cosigned, WITNESS_NAME, witness.public_key()) == 1_700_000_123
    # the log's own signature still verifies, and so does the head carrying the cosigned note
    verify_checkpoint(cosigned, "provmark.log/test", log_key.public_key())
    verify_tree_head(TreeHead(**{**{f: getattr(head, f) for f in head.__slots__}, "checkpoint": cosigned}),
                     log_key.public_key())
    again = cosign(cosigned, WITNESS_NAME, witness, timestamp=1_700_000_999)  # replaces its own line
    assert again.count("\n") == cosigned.count("\n") and verify_cosignature(again, WITNESS_NAME,
                                                                            witness.public_key()) == 1_700_000_999
    with pytest.raises(WitnessError, match="no cosignature by witness"):
        verify_cosignature(head.checkpoint, WITNESS_NAME, witness.public_key())
    with pytest.raises(WitnessError, match="2\\^63"):  # the spec's bound on the timestamp
        cosign(head.checkpoint, WITNESS_NAME, witness, timestamp=2**63)
    with pytest.raises(WitnessError, match="no cosignature by witness"):
        verify_cosignature(cosigned, WITNESS_NAME, Ed25519PrivateKey.generate().public_key())
    body, _, lines = cosigned.partition("\n\n")
    other_root = body.split("\n")
    other_root[2] = base64.b64encode(merkle.root_hash(leaves("b", 5))).decode()
    line = lines.split("\n")[1]
    blob = bytearray(base64.b64decode(line.split(" ")[2]))
    blob[11] ^= 1  # the timestamp's last byte: the signature covers the time line
    retimed = f"{body}\n\n{lines.split(chr(10))[0]}\n\u2014 {WITNESS_NAME} {base64.b64encode(bytes(blob)).decode()}\n"
    for tampered in ("\n".join(other_root) + "\n\n" + lines, retimed):
        with pytest.raises(WitnessError, match="does not verify"):
            verify_cosignature(tampered, WITNESS_NAME, witness.public_key())
        with pytest.raises((InvalidSignature, AssertionError)):
            spec_check(tampered, WITNESS_NAME, raw(witness.public_key()))
    assert merge_cosignatures(head.checkpoint, cosigned) == cosigned
    assert merge_cosignatures(head.checkpoint, "\n".join(other_root) + "\n\n" + lines) == head.checkpoint


def test_the_witness_cosigns_extensions_and_refuses_rollback_fork_rewrite_and_other_keys():
    log_key, witness = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    public = log_key.public_key()
    tree = leaves("a", 13)
    first = witness_update(None, public, head_of(log_key, tree[:6]), [], WITNESS_NAME, witness)
    assert spec_check(first, WITNESS_NAME, raw(witness.public_key()))
    proof = merkle.consistency_proof(6, tree)
    second = witness_update(first, public, head_of(log_key, tree), proof, WITNESS_NAME, witness)
    assert check_update(second, public, head_of(log_key, tree), []).tree_size == 13  # the same tree again
    rewritten = tree[:3] + leaves("b", 10)
    cases = {
        ROLLBACK: (head_of(log_key, tree[:6]), []),
        FORK: (head_of(log_key, rewritten), []),
        INCONSISTENT: (head_of(log_key, rewritten + leaves("c", 2)), merkle.consistency_proof(13, rewritten + leaves("c", 2))),
        LOG_SIGNATURE: (head_of(Ed25519PrivateKey.generate(), tree + leaves("c", 2)), []),
        ORIGIN_CHANGED: (head_of(log_key, tree + leaves("c", 2), origin="provmark.log/other"), []),
    }
    for kind, (checkpoint, path) in cases.items():
        with pytest.raises(Refusal) as refused:
            witness_update(second, public, checkpoint, path, WITNESS_NAME, witness)
        assert refused.value.kind == kind, refused.value.reason
    grown = tree + leaves("c", 2)
    with pytest.raises(Refusal, match="consistency proof does not verify") as refused:  # a proof of another pair
        check_update(second, public, head_of(log_key, grown), merkle.consistency_proof(6, grown))
    assert refused.value.kind == INCONSISTENT
    assert check_update(second, public, head_of(log_key, grown), merkle.consistency_proof(13, grown)).tree_size == 15


# ---- a witness run by an outsider against a detector over HTTP ---------------------------------------------

def events_in(store) -> int:
    with store.read() as session:
        return session.scalar(select(func.count()).select_from(AuditEventRow))


def _fill(store, count: int, tag: str) -> None:
    with store.write() as session:
        for i in range(count):
            append_event(session, "key.rotate", "tester", f"{tag}-{i}", {"n": i})


def _detector(home: Path, url: str):
    """A detector on ``url`` whose deployment identity adopted ``home``'s log key file: every database the
    tests build is logged under that one key, as a rewritten database would be."""
    app = create_app({"home": home, "vocab": shared_vocabulary(), "database_url": url})
    store = services_of(app).store
    signing_keys_for(store, home)
    return app, store


def _witness(capsys, base: str, state: Path, *extra: str) -> tuple[int, str, str]:
    code = main(["log", "witness", "--log", base, "--state", str(state), *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_outsider_s_witness_cosigns_two_heads_and_refuses_a_rewritten_or_shrunk_log(
        provmark_home, database_url, tmp_path, capsys):
    signer = LogSigner(provmark_home)
    app, store = _detector(provmark_home, database_url)
    state = tmp_path / "witness"
    _fill(store, 6, "a")
    first = keep_tree_head(store, signer)
    with serve(app) as base:
        code, out, err = _witness(capsys, base, state, "--name", WITNESS_NAME)
        assert code == 0 and "its first head (log key pinned)" in err, err
        assert main(["log", "witness-key", "--state", str(state)]) == 0
        vkey = capsys.readouterr().out.strip()
        name, witness_key = parse_witness_vkey(vkey)
        assert name == WITNESS_NAME and stat.S_IMODE((state / "witness.key").stat().st_mode) == 0o600
        assert out.startswith(first.checkpoint) and spec_check(out, WITNESS_NAME, raw(witness_key))
        cosigned_first = out
        _fill(store, 7, "b")
        second = keep_tree_head(store, signer)
        assert second.tree_size > first.tree_size
        status, bundle, _ = call("GET", base + f"/v1/log/proof/consistency?first={first.tree_size}"
                                 f"&second={second.tree_size}")  # no token
        assert status == 200 and bundle["second_head"] == second.to_dict()
        assert call("GET", base + f"/v1/log/proof/inclusion?id=a-1&tree_size={first.tree_size}")[0] == 401
        code, out, err = _witness(capsys, base, state, "--json")
        result = json.loads(out)
        assert code == 0 and result["ok"] and (result["previous_size"], result["tree_size"]) == \
            (first.tree_size, second.tree_size) and result["witness"] == vkey
        cosigned_second = result["checkpoint"]
        assert cosigned_second.startswith(second.checkpoint) and spec_check(cosigned_second, WITNESS_NAME,
                                                                             raw(witness_key))
        code, out, err = _witness(capsys, base, state)  # the log stood still: the same head, cosigned anew
        assert code == 0 and "the tree it cosigned before" in err and out.startswith(second.checkpoint)
        cosigned_second = out
        assert json.loads((state / "log.json").read_text())["checkpoint"] == cosigned_second
    saved = (state / "log.json").read_bytes()

    # the same log key over another database: first a tree of the witnessed size with other events (a fork),
    # then a larger one (a rewritten history), then a smaller log (a rollback)
    refusals = (("rewritten.db", second.tree_size, 0, "two trees of size"),
                ("rewritten.db", second.tree_size, 4, "consistency proof does not verify (history was rewritten)"),
                ("shrunk.db", first.tree_size - 2, 0, "the log's head shrank"))
    for db_name, size, more, reason in refusals:
        url = f"sqlite:///{tmp_path / db_name}"
        other_app, other = _detector(provmark_home, url)
        _fill(other, size - events_in(other), "z")  # the new detector logged its admin token already
        if size:
            keep_tree_head(other, signer)
        _fill(other, more, "y")
        keep_tree_head(other, signer)
        with serve(other_app) as base:
            code, out, err = _witness(capsys, base, state)
        assert code == 1 and out.startswith("REFUSED: ") and reason in out, (out, err)
        assert (state / "log.json").read_bytes() == saved  # the state is left as it was
        other.close()

    # check-proof --witness: passes on heads that carry the cosignature, fails on those that do not
    bundle_file, first_file, second_file = tmp_path / "proof.json", tmp_path / "first.note", tmp_path / "second.note"
    bundle_file.write_text(json.dumps(consistency_proof(store, first.tree_size, second.tree_size)))
    first_file.write_text(cosigned_first)
    second_file.write_text(cosigned_second)
    key = signer.public_document()["pem"]
    check = ["audit", "check-proof", str(bundle_file), "--log-key", key, "--witness", vkey]
    assert main(check) == 1
    assert "no cosignature by witness" in capsys.readouterr().out
    assert main([*check, "--cosigned", str(second_file)]) == 1  # the first head is not cosigned
    assert main([*check, "--cosigned", str(second_file), "--cosigned", str(first_file)]) == 0
    assert f"cosigned by witness {WITNESS_NAME}" in capsys.readouterr().out
    inclusion = inclusion_proof(store, signer, "b-2", tree_size=second.tree_size)
    inclusion["tree_head"]["checkpoint"] = cosigned_second  # a head that carries the cosignature itself
    bundle_file.write_text(json.dumps(inclusion))
    assert main(["audit", "check-proof", str(bundle_file), "--log-key", key]) == 0  # extra lines are no problem
    capsys.readouterr()
    assert main(check) == 0
    other_witness = witness_vkey("someone.else", Ed25519PrivateKey.generate().public_key())
    assert main([*check, "--witness", other_witness]) == 1
    assert "no cosignature by witness someone.else" in capsys.readouterr().out
    assert main(["audit", "check-proof", str(bundle_file), "--log-key", key, "--witness", "not-a-vkey"]) == 2

    # audit verify accepts kept heads whose checkpoint carries cosignatures
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE tree_heads SET checkpoint = :c WHERE tree_size = :n"),
                           {"c": cosigned_second, "n": second.tree_size})
    report = verify(store, log_key=signer.public_key)
    assert report.ok and report.tree_heads_checked == 2, report.problems
    store.close()


def test_a_witness_refuses_a_log_key_other_than_the_pinned_one(provmark_home, tmp_path, capsys):
    app, store = _detector(provmark_home, f"sqlite:///{tmp_path / 'log.db'}")
    _fill(store, 3, "a")
    keep_tree_head(store, LogSigner(provmark_home))
    state = tmp_path / "witness"
    other_key = LogSigner(tmp_path / "elsewhere").public_document()["pem"]
    with serve(app) as base:
        code, out, _ = _witness(capsys, base, state, "--log-key", other_key)
        assert code == 1 and "not signed by the pinned log key" in out and not (state / "log.json").exists()
        code, out, _ = _witness(capsys, base, state, "--log-key", LogSigner(provmark_home).public_document()["pem"])
        assert code == 0
        code, out, _ = _witness(capsys, base, state, "--log-key", other_key)
        assert code == 1 and "is not the key this witness pinned" in out
        code, _, err = _witness(capsys, base, state, "--name", "another-name")
        assert code == 2 and "its name is fixed" in err
    saved = (state / "log.json").read_bytes()
    code, out, err = _witness(capsys, base, state)  # the server is gone
    assert code == 2 and "cannot fetch" in err and not out and (state / "log.json").read_bytes() == saved
    os.chmod(state / "witness.key", 0o644)
    assert main(["log", "witness-key", "--state", str(state)]) == 2
    assert "readable by others" in capsys.readouterr().err
    store.close()
