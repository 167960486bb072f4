"""A key records the spec it watermarks with: stored sealed with the secret, read back from
keyrings written before the field existed, bound through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.cli import main
from watermark import key_binding
from watermark.config import WatermarkSpec
from watermark.key_binding import bound_spec, keys_bound_to, require_bound
from watermark.key_info import KeyringIntegrityError, KeySpecError
from watermark.keys import Keyring
from watermark.specs import parse_spec

MASTER = bytes(range(32))
LEFT = "kgw:scheme=lefthash,h=1,gamma=0.5,delta=2.0,prf=hmac-sha256"


@pytest.fixture
def home(provmark_home, monkeypatch) -> Path:
    """conftest's per-test PROVMARK_HOME, with no master key from the environment."""
    monkeypatch.delenv("PROVMARK_MASTER_KEY", raising=False)
    return provmark_home


def test_a_new_key_records_the_default_spec_or_the_one_given(home):
    ring = Keyring(home, master_key=MASTER)
    first = ring.create("a1")
    second = ring.create("b1", spec=LEFT)
    assert first.spec == WatermarkSpec.default().format() and second.spec == LEFT
    assert [i.spec for i in Keyring(home, master_key=MASTER).list()] == [first.spec, LEFT]  # persisted
    rotated = ring.rotate("c1", spec="kgw:scheme=minhash,h=2")
    assert WatermarkSpec.parse(rotated.spec).scheme == "minhash"


def test_an_hf_spec_cannot_be_bound_and_nothing_is_written(home):
    ring = Keyring(home, master_key=MASTER)
    with pytest.raises(KeySpecError, match="hf"):
        ring.create("a1", spec="hf:context_width=1")
    assert ring.list() == []


def test_a_keyring_written_before_specs_were_recorded_still_opens_bound_to_the_default(home, monkeypatch):
    monkeypatch.setattr(key_binding, "spec_to_bind", lambda spec: None)  # what the old code stored
    ring = Keyring(home, master_key=MASTER)
    old = ring.create("old1")
    monkeypatch.undo()
    monkeypatch.setenv("PROVMARK_HOME", str(home))
    raw = json.loads((home / "keyring.json").read_text())["entries"][0]
    assert "spec" not in raw  # byte-for-byte the old entry format
    reread = Keyring(home, master_key=MASTER)
    info = reread.list()[0]
    # the default spec as it was when the key was made (no code_delta): its fingerprint and calibrations stay
    assert info.spec is None and bound_spec(info) == WatermarkSpec.default().with_(code_delta=None)
    assert reread.secret("old1") and info.fingerprint == old.fingerprint
    reread.create("new1")  # the file is rewritten with the old entry still unchanged
    assert "spec" not in json.loads((home / "keyring.json").read_text())["entries"][0]
    assert Keyring(home, master_key=MASTER).secret("old1") == reread.secret("old1")


def test_editing_a_keys_spec_is_tampering(home):
    ring = Keyring(home, master_key=MASTER)
    ring.create("a1")
    path = home / "keyring.json"
    doc = json.loads(path.read_text())
    doc["entries"][0]["spec"] = LEFT
    path.write_text(json.dumps(doc))
    with pytest.raises(KeyringIntegrityError):
        Keyring(home, master_key=MASTER).list()


def test_delta_and_hard_are_not_colours_but_scheme_h_gamma_prf_are(home):
    info = Keyring(home, master_key=MASTER).create("a1")
    for same in ("kgw:delta=5", "kgw:hard", "kgw:scheme=selfhash,h=4,gamma=0.25"):
        require_bound(info, WatermarkSpec.parse(same))
    for other in ("kgw:h=3", "kgw:gamma=0.3", "kgw:scheme=minhash", "kgw:prf=sha3-256", "kgw:scheme=unigram"):
        with pytest.raises(KeySpecError, match="a1"):
            require_bound(info, WatermarkSpec.parse(other))
    assert keys_bound_to([info], WatermarkSpec.default()) == [info]
    with pytest.raises(KeySpecError, match="no detection key"):
        keys_bound_to([info], WatermarkSpec.parse("kgw:h=1"))


def test_cli_keys_create_binds_the_spec_and_refuses_a_bad_one(home, capsys):
    assert main(["keys", "create", "a1", "--no-calibrate", "--json", "--spec", LEFT]) == 0
    assert json.loads(capsys.readouterr().out)["spec"] == LEFT
    assert main(["keys", "create", "b1", "--no-calibrate", "--spec", "hf:context_width=1"]) != 0
    assert "hf" in capsys.readouterr().err
    assert main(["keys", "create", "b1", "--no-calibrate", "--spec", "kgw:gamma=3"]) != 0
    assert "gamma" in capsys.readouterr().err
    assert [i.key_id for i in Keyring().list()] == ["a1"]


def test_detect_batch_scores_a_key_only_under_its_own_spec(home, tmp_path, capsys):
    from detector.batch import BatchError, DetectOptions, prepare_jobs

    ring = Keyring(home)
    ring.create("a1")
    ring.create("b1", spec=LEFT)
    records = [{"text": "some words here"}, {"text": "more words", "watermark": LEFT}]
    prepared = prepare_jobs(records, DetectOptions(), keyring=ring, vocab=object())
    assert [job.keys for job in prepared.jobs] == [("a1",), ("b1",)]  # each spec tests the keys bound to it
    with pytest.raises(BatchError, match="record 1: key a1 is bound to"):
        prepare_jobs([{"text": "x", "keys": ["a1"], "watermark": LEFT}], DetectOptions(), keyring=ring, vocab=object())
    with pytest.raises(BatchError, match="no detection key is bound"):
        prepare_jobs([{"text": "x", "watermark": "kgw:h=2"}], DetectOptions(), keyring=ring, vocab=object())
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps({"text": "x", "keys": ["a1"], "watermark": "kgw:gamma=0.5"}) + "\n")
    assert main(["detect-batch", str(source), "--out", str(tmp_path / "out.jsonl")]) != 0
    assert "bound to" in capsys.readouterr().err


def test_detect_batch_records_naming_keys_and_no_spec_use_the_keys_own_spec(home):
    from detector.batch import BatchError, DetectOptions, prepare_jobs

    ring = Keyring(home)
    ring.create("a1")
    ring.create("b1", spec=LEFT)
    ring.create("g1", spec="gumbel:h=4")
    records = [{"text": "x", "keys": ["b1"]}, {"text": "y", "key": "g1"}, {"text": "z", "keys": ["a1"]}]
    prepared = prepare_jobs(records, DetectOptions(), keyring=ring, vocab=object())
    assert [(job.spec, job.keys) for job in prepared.jobs] == [
        (parse_spec(LEFT).format(), ("b1",)), ("gumbel:h=4,prf=hmac-sha256,dedup=true", ("g1",)),
        (parse_spec(None).format(), ("a1",))]
    prepared = prepare_jobs([{"text": "x"}], DetectOptions(), keys=["b1"], keyring=ring, vocab=object())
    assert prepared.jobs[0].spec == parse_spec(LEFT).format()  # --key b1 for the whole batch: b1's spec
    with pytest.raises(BatchError, match="record 1: the keys are bound to different specs"):
        prepare_jobs([{"text": "x", "keys": ["a1", "g1"]}], DetectOptions(), keyring=ring, vocab=object())


def test_sampling_specs_parse_and_bind_by_their_random_values():
    from watermark.key_binding import same_colours, spec_to_bind
    from watermark.scheme import make_watermark
    from watermark.specs import is_sampling, parse_spec

    assert same_colours(parse_spec(None), parse_spec("kgw:"))  # the default spec's code_delta is generation-only
    gumbel = parse_spec("gumbel:h=3")
    assert is_sampling(gumbel) and spec_to_bind("gumbel:h=3") == gumbel.format()
    assert same_colours(gumbel, parse_spec("gumbel:h=3,dedup=false"))  # dedup is generation-only
    assert not same_colours(gumbel, parse_spec("gumbel:h=4"))
    assert not same_colours(gumbel, parse_spec("vllm:gumbel,h=3"))
    assert not same_colours(parse_spec("synthid:layers=30"), parse_spec("synthid:layers=20"))
    assert same_colours(parse_spec("synthid:top_k=40"), parse_spec("synthid:top_k=0"))
    with pytest.raises(ValueError, match="public key"):
        spec_to_bind("hf:synthid,keys=1:2")
    assert type(make_watermark("synthid:h=2", b"k" * 32, 100)).__name__ == "SynthIDWatermark"


def test_a_running_detector_tests_the_keys_bound_since_its_last_verdict(home):
    """The detector keeps the keys bound to each spec between verdicts (parsing every key's spec on every verdict
    cost ~20 us); a key created, or bound elsewhere, since must still change the next verdict's keys."""
    from detector.service import Detector
    from watermark.vocab import load_vocabulary

    ring = Keyring()
    ring.create("a1")
    detector = Detector(vocab=load_vocabulary(), keyring=ring)
    text = "The harbour board met on Monday and approved the new ferry timetable for the winter months."
    assert [k["key_id"] for k in detector.detect(text).keys] == ["a1"]
    ring.create("b2", spec="kgw:scheme=minhash,h=2")  # bound to another spec: not tested under the default
    ring.create("c3")
    assert sorted(k["key_id"] for k in detector.detect(text).keys) == ["a1", "c3"]
    assert [k["key_id"] for k in detector.detect(text, spec="kgw:scheme=minhash,h=2").keys] == ["b2"]
    ring.retire("c3")
    assert [k["key_id"] for k in detector.detect(text).keys] == ["a1"]
