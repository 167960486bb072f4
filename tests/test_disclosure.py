"""The detect-scope view of a verdict (detector.disclosure): conservative, deterministic per text, and
near the threshold a one-unit change is read with probability 1 / STEP_UNITS at any length, not 1."""

import math

import numpy as np
import pytest
from http_fixtures import human_text, shared_vocabulary, watermarked_text

from detector.disclosure import DETECT_FIELDS, STEP_UNITS, dither, shown_z, z_step
from detector.scoring_request import DetectOptions
from detector.service import Detector
from watermark.keys import Keyring
from watermark.stats import p_value_normal, z_for_p

ALPHA = p_value_normal(4.0)
U_GRID = (np.arange(10_000) + 0.5) / 10_000  # u spread evenly over [0, 1)
GAMMA = 0.25
STEP_200 = z_step(200, GAMMA)


@pytest.fixture
def keyring(provmark_home):
    ring = Keyring(provmark_home)
    ring.create("k-disc")
    return ring


@pytest.mark.parametrize("z", [-3.0, 0.0, 2.5, 3.99, 4.0, 4.3, 7.77, 30.0])
def test_the_shown_z_is_never_above_the_exact_one_and_on_the_grid(z):
    shown = np.array([shown_z(p_value_normal(z), ALPHA, u, STEP_200) for u in U_GRID])
    assert (shown <= z + 1e-9).all()
    steps = (shown - 4.0) / STEP_200
    assert np.allclose(steps, np.round(steps))


@pytest.mark.parametrize("scored", [20, 200, 2000])
@pytest.mark.parametrize("units", [0.3, 1, 2.5])
def test_a_change_of_one_unit_moves_the_shown_z_with_probability_one_over_step_units(scored, units):
    """Uniform dither: P(shown >= threshold) = (z - threshold) / w, so ``units`` green-count units above the
    threshold (z moved by units * d) are seen with probability units / STEP_UNITS at every length."""
    d = 1 / np.sqrt(scored * GAMMA * (1 - GAMMA))
    step = z_step(scored, GAMMA)
    crossed = np.mean([shown_z(p_value_normal(4.0 + units * d), ALPHA, u, step) >= 4.0 - 1e-9 for u in U_GRID])
    assert crossed == pytest.approx(units / STEP_UNITS, abs=2e-4)


def test_dither_depends_on_the_set_of_units_not_their_order_or_repeats():
    key = bytes(32)
    units = np.array([[5, 1], [7, 2], [9, 3]])
    same = dither(key, "fp", "k", units[[2, 0, 1, 0]])
    assert dither(key, "fp", "k", units) == same
    assert dither(key, "fp", "k", units[:2]) != same
    assert dither(bytes([1] * 32), "fp", "k", units) != same
    assert 0.0 <= same < 1.0
    assert 0.0 <= dither(key, "fp", "k", np.zeros((0, 2), dtype=np.int64)) < 1.0


def test_detect_view_of_a_watermarked_and_a_human_text(keyring):
    detector = Detector(vocab=shared_vocabulary(), keyring=keyring)
    human = human_text(1200)
    marked = watermarked_text(shared_vocabulary(), keyring.secret("k-disc"), human)
    for text, expected in ((marked, "watermarked"), (human, "not_watermarked")):
        verdict = detector.detect(text, options=DetectOptions(windows=True))
        view = verdict.disclose("detect")
        assert verdict.verdict == expected and view["verdict"] == expected
        assert set(view) == {*DETECT_FIELDS, "disclosure", "z_score", "p_value", "key_id", "decided_by", "windows",
                             "calibration_id", "spoof_suspected", "paraphrase_of_own_output"}
        assert view["p_value"] >= verdict.p_value and view["z_score"] <= max(0.0, z_for_p(verdict.p_value))
        assert view == detector.detect(text, options=DetectOptions(windows=True)).disclose("detect")  # deterministic per text
        assert verdict.disclose("explain") == verdict.to_dict()
        if expected == "watermarked":
            assert view["key_id"] == "k-disc" and view["windows"]["detected"] in (True, False)
            assert set(view["windows"]) <= {"detected", "char_start", "char_end"}
        else:
            assert view["key_id"] is None and view["windows"] == {"detected": False}
    with pytest.raises(ValueError, match="scope"):
        verdict.disclose("audit")


def test_power_cost_of_the_dither_is_bounded_by_one_step():
    """A text whose exact z clears the threshold by a full step is always shown as watermarked."""
    for u in U_GRID[::97]:
        assert shown_z(p_value_normal(4.0 + STEP_200 + 1e-9), ALPHA, u, STEP_200) >= 4.0 - 1e-9
    assert math.isfinite(shown_z(0.0, ALPHA, 0.5, STEP_200))  # p = 0 (far past any threshold) is finite
    assert math.isfinite(shown_z(1.0, ALPHA, 0.5, STEP_200))  # p = 1 (z = -inf) too


def test_hf_specs_are_dithered_without_a_master_key(provmark_home):
    """hf colours are public: their detect view needs no secret, so detecting creates no master key."""
    detector = Detector(vocab=shared_vocabulary(), keyring=Keyring(provmark_home))
    view = detector.detect(human_text(600), spec="hf:context_width=1").disclose("detect")
    assert view["verdict"] in ("not_watermarked", "insufficient_text") and "num_green_tokens" not in view
    assert not (provmark_home / "master.key").exists()


def _asdict_form(verdict) -> dict:
    """What ``Verdict.to_dict`` returned while it copied the fields with ``dataclasses.asdict``."""
    from dataclasses import asdict

    out = asdict(verdict)
    del out["dither"], out["spec"]  # neither is part of the verdict a caller reads
    return verdict.finished(out)


def _shares_a_container(a, b) -> bool:
    if isinstance(a, (dict, list)) and a is b:
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return any(_shares_a_container(a[k], b[k]) for k in a if k in b)
    if isinstance(a, list) and isinstance(b, list):
        return any(_shares_a_container(x, y) for x, y in zip(a, b))
    return False


def test_to_dict_is_the_asdict_tree_and_shares_no_container_with_the_verdict(provmark_home):
    """Every kind of verdict field (keys, windows, an explanation, a two-part key's report, a sampling spec's
    statistic, a calibration, the spoof check): the same JSON-like tree as ``dataclasses.asdict``, types and all,
    and editing it leaves the verdict as it was."""
    import json

    ring = Keyring(provmark_home)
    secret = bytes(range(32))
    ring.create("k-two", secret=secret, public_half=True)
    ring.create("k-gumbel", spec="gumbel:h=4")
    vocab = shared_vocabulary()
    detector = Detector(vocab=vocab, keyring=ring)
    marked = watermarked_text(vocab, secret, human_text(1500))
    verdicts = [detector.detect(marked, keys=["k-two"], options=DetectOptions(windows=True, explain=True)),
                detector.detect(human_text(900, 3000), keys=["k-two"], options=DetectOptions(windows=True)),
                detector.detect("too short", keys=["k-two"]),
                detector.detect(human_text(900), keys=["k-gumbel"], options=DetectOptions(explain=True)),
                detector.detect(human_text(600), spec="hf:", options=DetectOptions(windows=True))]
    assert verdicts[0].watermarked and verdicts[0].public_half and verdicts[0].explanation and verdicts[3].statistic
    for verdict in verdicts:
        before = json.dumps(_asdict_form(verdict), sort_keys=True)
        out = verdict.to_dict()
        assert out == _asdict_form(verdict)
        assert list(out) == list(_asdict_form(verdict))  # the same field order (the JSON a client reads)
        assert json.dumps(out, sort_keys=True) == before
        fields_of = {name: getattr(verdict, name) for name in out if hasattr(verdict, name)}
        assert not any(_shares_a_container(out[name], value) for name, value in fields_of.items())
        for value in out.values():  # edit every container of the copy: the verdict does not change
            if isinstance(value, dict):
                value.clear()
            elif isinstance(value, list):
                value.append("edited")
        assert json.dumps(_asdict_form(verdict), sort_keys=True) == before
