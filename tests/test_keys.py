"""The keyring: encryption at rest, tamper detection, lifecycle, locking."""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from watermark import keyring_seal
from watermark.key_info import (
    InvalidKeyIdError,
    KeyExistsError,
    KeyInfo,
    KeyNotFoundError,
    KeyringError,
    KeyringIntegrityError,
    KeyStateError,
    MasterKeyError,
    WrongMasterKeyError,
    key_fingerprint,
)
from watermark.keyring_seal import format_master_key
from watermark.keys import Keyring

MASTER = bytes(range(32))  # a fixed test master key
OTHER_MASTER = bytes(range(1, 33))


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    monkeypatch.setenv("PROVMARK_HOME", str(folder))
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)
    return folder


def encodings(secret: bytes) -> list[bytes]:
    """The secret in every text form it could leak as."""
    forms = [secret, secret.hex().encode(), secret.hex().upper().encode(), base64.b32encode(secret)]
    for b64 in (base64.b64encode(secret), base64.urlsafe_b64encode(secret)):
        forms += [b64, b64.rstrip(b"=")]
    return forms


def assert_absent(secret: bytes, blob: bytes) -> None:
    for form in encodings(secret):
        assert form not in blob


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def resealed(path: Path, master: bytes, edit) -> None:
    """Apply ``edit`` to the stored document and recompute its file MAC (needs the master key)."""
    doc = json.loads(path.read_text())
    edit(doc)
    body = {name: doc[name] for name in ("format", "master_key_check", "entries")}
    doc["mac"] = keyring_seal.document_mac(body, keyring_seal.MasterKeys(master, "test").mac_key)
    path.write_text(json.dumps(doc))


# --- lifecycle ---------------------------------------------------------------------------------


def test_first_key_is_active_later_ones_standby(home):
    kr = Keyring()
    first = kr.create()
    second = kr.create("second")
    assert first.status == "active" and second.status == "standby"
    assert first.key_id.startswith("k-") and len(first.key_id) == 10
    assert kr.active() == first
    assert [k.key_id for k in kr.list()] == [first.key_id, "second"]
    assert [k.key_id for k in kr.detection_keys()] == [first.key_id, "second"]
    assert first.created_at.endswith("Z") and first.retired_at is None


def test_secrets_are_32_random_bytes_matching_fingerprints(home):
    kr = Keyring()
    infos = [kr.create() for _ in range(3)]
    secrets_ = [kr.secret(info.key_id) for info in infos]
    assert all(len(s) == 32 for s in secrets_) and len(set(secrets_)) == 3
    assert [key_fingerprint(s) for s in secrets_] == [info.fingerprint for info in infos]
    assert Keyring().secret(infos[0].key_id) == secrets_[0]  # a second instance reads the same key


def test_rotate_makes_new_active_and_keeps_old_for_detection(home):
    kr = Keyring()
    kr.create("old")
    old_secret = kr.secret("old")
    new = kr.rotate()
    statuses = {k.key_id: k.status for k in kr.list()}
    assert new.status == "active" and statuses == {"old": "rotated", new.key_id: "active"}
    assert [k.key_id for k in kr.detection_keys()] == [new.key_id, "old"]
    assert kr.secret("old") == old_secret  # re-sealed under new metadata, same secret
    named = kr.rotate("named")
    assert kr.active() == named
    assert [k.key_id for k in kr.detection_keys()] == ["named", new.key_id, "old"]


def test_rotate_to_standby_promotes_it_and_refuses_other_statuses(home):
    kr = Keyring()
    kr.create("a")
    kr.create("b")  # standby
    assert kr.rotate("b").status == "active"
    assert {k.key_id: k.status for k in kr.list()} == {"a": "rotated", "b": "active"}
    before = kr.path.read_bytes()
    for key_id in ("a", "b"):
        with pytest.raises(KeyStateError):
            kr.rotate(key_id)
    assert kr.path.read_bytes() == before  # a refused operation writes nothing


def test_retire_refuses_active_key(home):
    kr = Keyring()
    kr.create("a")
    with pytest.raises(KeyStateError, match="rotate"):
        kr.retire("a")
    assert kr.active().key_id == "a"


def test_retire_removes_from_detection_but_keeps_secret_unless_purged(home):
    kr = Keyring()
    kr.create("a")
    secret_a = kr.secret("a")
    kr.rotate("b")
    retired = kr.retire("a")
    assert retired.status == "retired" and retired.retired_at is not None and not retired.purged
    assert [k.key_id for k in kr.detection_keys()] == ["b"]
    assert kr.secret("a") == secret_a
    assert kr.retire("a") == retired  # idempotent
    purged = kr.retire("a", purge=True)
    assert purged.purged and purged.retired_at == retired.retired_at
    with pytest.raises(KeyNotFoundError, match="purge"):
        kr.secret("a")
    assert [k.key_id for k in kr.list()] == ["a", "b"]  # ids stay listed, never reused
    with pytest.raises(KeyExistsError):
        kr.create("a")
    assert_absent(secret_a, kr.path.read_bytes())


def test_active_on_empty_keyring_hints_at_create_and_ensure_active_creates_once(home):
    kr = Keyring()
    with pytest.raises(KeyNotFoundError, match="provmark keys create"):
        kr.active()
    assert kr.list() == [] and kr.detection_keys() == []
    first = kr.ensure_active()
    assert kr.ensure_active() == first and len(kr.list()) == 1


def test_unknown_and_invalid_ids_give_clean_errors(home):
    kr = Keyring()
    kr.create("a")
    with pytest.raises(KeyNotFoundError) as caught:
        kr.secret("nope")
    assert isinstance(caught.value, KeyError)
    assert str(caught.value).startswith("no key nope")  # not KeyError's quoted repr
    pasted = "ab" * 32  # looks like a pasted secret: must not be echoed
    for bad in ("Bad", "-x", "", "x" * 33, pasted):
        with pytest.raises(InvalidKeyIdError) as caught:
            kr.create(bad)
        assert bad == "" or bad not in str(caught.value)
    with pytest.raises(KeyNotFoundError) as caught:
        kr.secret(pasted)
    assert pasted not in str(caught.value)
    assert kr.create("y" * 32).key_id == "y" * 32
    with pytest.raises(KeyExistsError):
        kr.create("a")


# --- secrecy and file modes --------------------------------------------------------------------


def test_files_are_private_and_hold_no_secret(home):
    kr = Keyring()
    kr.create()
    kr.create()
    kr.rotate()
    kr.retire(kr.list()[0].key_id)
    blob = kr.path.read_bytes()
    for info in kr.list():
        assert_absent(kr.secret(info.key_id), blob)
    master = keyring_seal.parse_master_key((home / "master.key").read_text())
    assert_absent(master, blob)
    for name in ("keyring.json", "master.key", "keyring.lock"):
        assert mode_of(home / name) == 0o600
    # no temp files left behind
    assert sorted(p.name for p in home.iterdir()) == ["keyring.json", "keyring.lock", "master.key"]


def test_master_key_file_is_0600_from_creation(home, monkeypatch):
    created = []
    real_open, real_link = os.open, os.link

    def spy_open(path, flags, mode=0o777, **kw):
        if flags & os.O_CREAT:
            created.append((Path(path).name, mode, bool(flags & os.O_EXCL)))
        return real_open(path, flags, mode, **kw)

    def spy_link(src, dst, **kw):
        assert mode_of(Path(src)) == 0o600  # private before it gets its public name
        return real_link(src, dst, **kw)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "link", spy_link)
    old_umask = os.umask(0)  # a permissive umask must not widen anything
    try:
        Keyring().create()
    finally:
        os.umask(old_umask)
    master_tmp = [c for c in created if "master.key" in c[0]]
    assert master_tmp and all(mode == 0o600 and excl for _, mode, excl in master_tmp)
    assert all(mode == 0o600 for _, mode, _ in created)
    assert mode_of(home / "master.key") == 0o600 and mode_of(home / "keyring.json") == 0o600


def test_reprs_hold_no_secret(home):
    kr = Keyring(master_key=MASTER)
    info = kr.create()
    secret = kr.secret(info.key_id)
    text = (repr(info) + repr(kr) + str(kr) + repr(kr.list()) + json.dumps(info.to_dict())).encode()
    assert_absent(secret, text)
    assert_absent(MASTER, text)
    assert "secret" not in KeyInfo.__slots__


# --- master key --------------------------------------------------------------------------------


def test_env_master_key_hex_and_base64url_open_the_same_keyring(home, monkeypatch):
    monkeypatch.setenv("PROVMARK_MASTER_KEY", MASTER.hex())
    info = Keyring().create()
    assert not (home / "master.key").exists()
    for text in (format_master_key(MASTER), format_master_key(MASTER) + "=", MASTER.hex().upper()):
        monkeypatch.setenv("PROVMARK_MASTER_KEY", text)
        assert Keyring().active() == info
    assert Keyring(master_key=MASTER).active() == info


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "zz" * 32,
        MASTER.hex()[:-2],
        MASTER.hex() + "00",
        base64.urlsafe_b64encode(MASTER[:16]).decode(),
    ],
)
def test_malformed_env_master_key_is_a_clear_error(home, monkeypatch, value):
    monkeypatch.setenv("PROVMARK_MASTER_KEY", value)
    with pytest.raises(MasterKeyError, match="PROVMARK_MASTER_KEY is malformed") as caught:
        Keyring().create()
    assert value not in str(caught.value)


def test_master_key_argument_must_be_32_bytes(home):
    with pytest.raises(MasterKeyError, match="master_key"):
        Keyring(master_key=b"short")


def test_wrong_master_key_is_an_integrity_error(home):
    Keyring(master_key=MASTER).create()
    with pytest.raises(WrongMasterKeyError, match="wrong master key") as caught:
        Keyring(master_key=OTHER_MASTER).list()
    assert isinstance(caught.value, KeyringIntegrityError)


def test_missing_master_key_is_not_silently_regenerated(home):
    Keyring().create()
    (home / "master.key").unlink()
    with pytest.raises(MasterKeyError, match="master key is missing"):
        Keyring().create()
    assert not (home / "master.key").exists()


def test_world_readable_master_key_file_is_refused(home):
    Keyring().create()
    (home / "master.key").chmod(0o644)
    with pytest.raises(MasterKeyError, match="chmod 600"):
        Keyring().list()


# --- tampering ---------------------------------------------------------------------------------


def _flip_ciphertext(doc):
    raw = bytearray(base64.b64decode(doc["entries"][0]["ciphertext"]))
    raw[0] ^= 1
    doc["entries"][0]["ciphertext"] = base64.b64encode(bytes(raw)).decode()


def _set_status(doc):
    doc["entries"][1]["status"] = "retired"


def _delete_entry(doc):
    del doc["entries"][1]


def _reorder(doc):
    doc["entries"].reverse()


def _swap_ciphertexts(doc):
    a, b = doc["entries"][0], doc["entries"][1]
    a["nonce"], b["nonce"] = b["nonce"], a["nonce"]
    a["ciphertext"], b["ciphertext"] = b["ciphertext"], a["ciphertext"]


def _set_created_at(doc):
    doc["entries"][0]["created_at"] = "2000-01-01T00:00:00Z"


TAMPERS = [_flip_ciphertext, _set_status, _delete_entry, _reorder, _swap_ciphertexts, _set_created_at]


def _three_keys(home) -> Keyring:
    kr = Keyring(master_key=MASTER)
    kr.create("a")
    kr.rotate("b")
    kr.create("c")
    return kr


@pytest.mark.parametrize("tamper", TAMPERS, ids=lambda f: f.__name__.strip("_"))
def test_edited_file_fails_authentication(home, tamper):
    kr = _three_keys(home)
    doc = json.loads(kr.path.read_text())
    tamper(doc)
    kr.path.write_text(json.dumps(doc))
    with pytest.raises(KeyringIntegrityError):
        kr.list()


@pytest.mark.parametrize("tamper", [_flip_ciphertext, _set_status, _swap_ciphertexts, _set_created_at])
def test_entry_metadata_is_bound_to_its_ciphertext_even_with_a_valid_file_mac(home, tamper):
    kr = _three_keys(home)
    resealed(kr.path, MASTER, tamper)  # second layer: AES-GCM associated data
    with pytest.raises(KeyringIntegrityError, match="tampered"):
        kr.list()


@pytest.mark.parametrize("content", [b"", b"not json", b"[]", b'{"format": "x"}'])
def test_garbage_file_is_an_integrity_error(home, content):
    kr = _three_keys(home)
    kr.path.write_bytes(content)
    with pytest.raises(KeyringIntegrityError):
        kr.list()


# --- concurrency -------------------------------------------------------------------------------


def _create_keys(home: str, count: int, start) -> None:
    start.wait()
    kr = Keyring(Path(home))
    for _ in range(count):
        kr.create()


def test_concurrent_creates_from_processes_lose_nothing(home):
    processes_, per_process = 4, 5
    ctx = multiprocessing.get_context("spawn")  # no fork of a possibly threaded test runner
    start = ctx.Event()
    args = (str(home), per_process, start)
    workers = [ctx.Process(target=_create_keys, args=args) for _ in range(processes_)]
    for worker in workers:
        worker.start()
    start.set()  # all workers race for the first write, including generating master.key
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0] * processes_
    infos = Keyring().list()
    assert len(infos) == processes_ * per_process and len({i.key_id for i in infos}) == len(infos)
    assert sum(i.status == "active" for i in infos) == 1
    assert len({Keyring().secret(i.key_id) for i in infos}) == len(infos)


# --- property: lifecycle invariants ------------------------------------------------------------

IDS = st.sampled_from(["a", "b", "c", "d"])
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.none() | IDS),
        st.tuples(st.just("rotate"), st.none() | IDS),
        st.tuples(st.just("retire"), IDS),
    ),
    max_size=10,
)


def _model_step(model: dict[str, str], op: str, key_id: str | None) -> type[KeyringError] | None:
    """The expected error, or None after applying the op to the model (new ids are filled in later)."""
    exists = key_id in model
    if op == "create":
        return KeyExistsError if exists else None
    if op == "rotate":
        return KeyStateError if exists and model[key_id] != "standby" else None
    if not exists:
        return KeyNotFoundError
    if model[key_id] == "active":
        return KeyStateError
    model[key_id] = "retired"
    return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS)
def test_lifecycle_keeps_one_active_key_and_consistent_detection_keys(operations):
    with tempfile.TemporaryDirectory() as folder:
        kr = Keyring(Path(folder), master_key=MASTER)
        model: dict[str, str] = {}  # id -> status, in creation order
        for op, key_id in operations:
            expected = _model_step(model, op, key_id)
            if expected is not None:
                with pytest.raises(expected):
                    getattr(kr, op)(key_id)
            elif op == "create":
                info = kr.create(key_id)
                model[info.key_id] = "standby" if "active" in model.values() else "active"
            elif op == "rotate":
                info = kr.rotate(key_id)
                model.update({k: "rotated" for k, s in model.items() if s == "active"})
                model[info.key_id] = "active"
            else:
                kr.retire(key_id)
            infos = kr.list()
            assert {i.key_id: i.status for i in infos} == model
            assert [i.key_id for i in infos] == list(model)
            assert sum(s == "active" for s in model.values()) == (1 if model else 0)
            detection = [i.key_id for i in kr.detection_keys()]
            active = [k for k, s in model.items() if s == "active"]
            others = [k for k, s in reversed(model.items()) if s in ("standby", "rotated")]
            assert detection == active + others
