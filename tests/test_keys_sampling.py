"""``provmark keys`` with sampling specs (create, rotate, calibrate, list; the detector uses the calibration),
and ``keys list`` marking a calibration made under another common-unit table as stale."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from http_fixtures import shared_vocabulary

from api.cli import main
from detector import calibrate as measuring
from detector import common_units
from detector.calibration import Bucket, Calibration, CalibrationStore
from detector.service import Detector
from watermark.keys import Keyring
from watermark.specs import parse_spec

GUMBEL = "gumbel:h=4"


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def stored_calibration(key_id: str, spec: str, common: str | None) -> Calibration:
    """A calibration as `keys calibrate` stores it (numbers made up: only which table it used matters here)."""
    mark_fingerprint = parse_spec(spec).fingerprint(shared_vocabulary().vocab_size)
    info = next(i for i in Keyring().list() if i.key_id == key_id)
    return Calibration(key_id, info.fingerprint, parse_spec(spec).format(), mark_fingerprint, common,
                       "2026-01-01T00:00:00Z", tuple(Bucket(i, 0, 0.0, 1.0) for i in range(8)), {}, {})


def test_keys_list_marks_a_calibration_made_under_an_older_common_unit_table_stale(provmark_home, capsys):
    assert run(capsys, "keys", "create", "a1", "--no-calibrate")[0] == 0
    ring = Keyring()
    store = CalibrationStore(ring)
    default = parse_spec(None).format()
    store.put(stored_calibration("a1", default, "0123456789abcdef"))  # a table since replaced
    code, out, _ = run(capsys, "keys", "list", "--json")
    assert code == 0
    [listed] = json.loads(out)[0]["calibrations"]
    assert listed["stale"] is True
    code, out, _ = run(capsys, "keys", "list")
    assert code == 0 and "stale" in out and default in out
    # the detector does not use it either
    detector = Detector(vocab=shared_vocabulary(), keyring=ring)
    assert detector.detect("A few words of human text to score here.").calibration is None

    current = common_units.for_vocabulary(shared_vocabulary()).digest
    store.put(stored_calibration("a1", default, current))
    [listed] = json.loads(run(capsys, "keys", "list", "--json")[1])[0]["calibrations"]
    assert listed["stale"] is False
    assert "stale" not in run(capsys, "keys", "list")[1]


def test_keys_create_and_rotate_bind_sampling_specs_and_list_shows_them(provmark_home, capsys):
    code, out, _ = run(capsys, "keys", "create", "g1", "--spec", GUMBEL, "--no-calibrate", "--json")
    assert code == 0 and json.loads(out)["spec"] == parse_spec(GUMBEL).format()
    code, out, _ = run(capsys, "keys", "rotate", "s1", "--spec", "synthid:h=4,layers=20", "--no-calibrate", "--json")
    assert code == 0 and json.loads(out)["spec"] == parse_spec("synthid:h=4,layers=20").format()
    assert run(capsys, "keys", "create", "v1", "--spec", "vllm:gumbel", "--no-calibrate")[0] == 0
    code, out, _ = run(capsys, "keys", "list")
    for spec in (GUMBEL, "synthid:h=4,layers=20", "vllm:gumbel"):
        assert parse_spec(spec).format() in out
    code, _, err = run(capsys, "keys", "create", "x1", "--spec", "gumbel:h=0", "--no-calibrate")
    assert code == 2 and "h: expected an integer" in err
    code, _, err = run(capsys, "keys", "create", "x1", "--spec", "hf:synthid,keys=1:2", "--no-calibrate")
    assert code == 2 and "public key" in err


@pytest.fixture
def small_windows(monkeypatch):
    """Calibration on fewer human windows (the same code path; the full run takes minutes per key)."""
    monkeypatch.setattr(measuring, "WINDOWS_PER_LENGTH", 12)
    monkeypatch.setattr(measuring, "WINDOW_LENGTHS", (64, 256))
    monkeypatch.setattr(measuring.HumanWindows, "_cache", {})
    yield
    measuring.HumanWindows._cache = {}


def test_keys_calibrate_measures_a_sampling_key_under_its_own_spec_and_the_detector_uses_it(
        provmark_home, capsys, small_windows):
    assert run(capsys, "keys", "create", "g1", "--spec", GUMBEL, "--no-calibrate")[0] == 0
    code, out, err = run(capsys, "keys", "calibrate", "g1", "--json", "--no-progress")
    assert code == 0, err
    [result] = json.loads(out)
    assert result["spec"] == parse_spec(GUMBEL).format() and result["key_id"] == "g1"
    assert result["common_units"] == common_units.for_vocabulary(shared_vocabulary()).digest
    measured = [b for b in result["buckets"] if b["n"] > 1]
    assert measured and all(abs(b["mean_z"]) < 1.5 and 0.2 < b["sd_z"] < 3 for b in measured)  # z = probit of p
    [listed] = json.loads(run(capsys, "keys", "list", "--json")[1])[0]["calibrations"]
    assert listed["id"] == result["id"] and listed["stale"] is False

    ring = Keyring()
    detector = Detector(vocab=shared_vocabulary(), keyring=ring)
    verdict = detector.detect("Some words of human text, long enough to be scored by the key.", spec=GUMBEL)
    assert verdict.calibration is not None and verdict.calibration["id"] == result["id"]

    # a null shifted up in every bucket is held to: the verdict's p-value grows, never shrinks
    store = CalibrationStore(ring)
    stored = store.get("g1", parse_spec(GUMBEL).fingerprint(shared_vocabulary().vocab_size))
    shifted = replace(stored, buckets=tuple(Bucket(b.index, 400, 1.0, 1.0) for b in stored.buckets))
    store.put(shifted)
    guarded = Detector(vocab=shared_vocabulary(), keyring=ring).detect(
        "Some words of human text, long enough to be scored by the key.", spec=GUMBEL)
    assert guarded.calibration["guarded"] is True and guarded.p_value > verdict.p_value


def test_keys_create_screens_and_calibrates_a_sampling_key(provmark_home, capsys, small_windows):
    code, out, err = run(capsys, "keys", "create", "s1", "--spec", "synthid:h=4", "--json", "--no-progress")
    assert code == 0, err
    created = json.loads(out)
    assert created["spec"] == parse_spec("synthid:h=4").format()
    assert created["calibration"]["spec"] == created["spec"] and created["calibration"]["screening_draws"] >= 1
