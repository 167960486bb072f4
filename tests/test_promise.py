"""What a verdict's false-positive rate promises (detector/promise.py): bounded for a collection nobody measured,
measured where the deployment gave its texts (``keys calibrate --corpus``), and said in every verdict.

The situation users are in: ONE fixed key, many human texts of one collection it never saw. A key whose null is
shifted up on that collection sees more than the stated rate at z = 4; the bounded promise's margin takes it back.
The collection here is pandas' source (a code base held out of the common-unit table's fit half and of the
collections the margins were fitted on, research/scripts/key_shift_table.py), the key one of 24 fixed keys that is shifted
on it by +0.37 (4.5 times the stated rate at z = 4 without the margin). Bounds from the math: a mean effective z
of 0.1525 doubles the rate at z = 4; the flagged texts are held to the binomial tail of the stated rate.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import special
from scipy.stats import binom

from detector import calibrate as measuring
from detector import common_units, human_corpora, promise
from detector.calibration import Bucket, Calibration, CalibrationStore
from detector.scoring_request import DetectOptions
from detector.service import Detector
from evaluation.prefix import prefix_p_values
from watermark.keys import Keyring
from watermark.scheme import Watermark
from watermark.specs import parse_spec
from watermark.stats import p_value_binomial, p_value_normal
from watermark.vocab import load_vocabulary

SPEC = "kgw:scheme=selfhash"
SHIFTED_KEY = hashlib.sha256(b"provmark-promise-test/21").digest()  # mean z +0.37 on the collection below
ALPHA = p_value_normal(4.0)
DOUBLED = 4.0 - float(special.ndtri(1.0 - 2.0 * ALPHA))  # mean z at which the rate at z = 4 is twice the stated one
PROSE = ("The lighthouse keeper walked along the shore every evening, watching the fishing boats come in "
         "before the weather turned. ") * 4
CODE = "def area(width, height):\n    # the area of a rectangle\n    return {\"area\": width * height}\n" * 6


class OneKey:
    """A keyring stand-in holding one fixed secret (no calibration, no table of the deployment's texts)."""

    path = Path("/nonexistent/provmark-test-keyring.json")

    def detection_keys(self):
        return [SimpleNamespace(key_id="k")]

    def secret(self, key_id):
        return SHIFTED_KEY


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


@pytest.fixture(scope="module")
def held_out_code() -> list[str]:
    """pandas' own modules (tests and vendored code left out), each file's first 8,000 characters."""
    assert human_corpora.HumanDoc("packages", "", "", "pkg:pandas", True).split == human_corpora.HELD_OUT
    dist = importlib.metadata.distribution("pandas")
    skip = re.compile(r"/tests?/|/testing/|/_?vendor")
    files = sorted(f for f in dist.files if f.suffix == ".py" and not skip.search("/" + f.as_posix()))
    texts = [Path(str(dist.locate_file(f))).read_text(encoding="utf-8") for f in files]
    return [t[:8000] for t in texts if len(t) >= 2000][:240]


def effective_z(verdicts) -> np.ndarray:
    """The normal quantile of the p-value each verdict gives: its own where the promise or guard raised it
    (``calibration.guarded`` / ``promise.raised``), else the binomial mid-p of its counts."""
    found = []
    for v in verdicts:
        g, t = v.num_green_tokens, v.num_tokens_scored
        if not t:
            continue
        if v.promise["raised"]:
            p = v.p_value
        else:
            p = p_value_binomial(g + 1, t, 0.25) + 0.5 * (p_value_binomial(g, t, 0.25) - p_value_binomial(g + 1, t, 0.25))
        found.append(-special.ndtri(max(p, 1e-300)))
    return np.array(found)


def test_a_fixed_key_keeps_its_stated_rate_on_a_code_base_nobody_measured(vocab, held_out_code):
    detector = Detector(vocab=vocab, keyring=OneKey())
    verdicts = [detector.detect(text, spec=SPEC) for text in held_out_code]
    assert {v.promise["promise"] for v in verdicts} == {promise.BOUNDED}
    assert sum(v.promise["kind"] == promise.CODE for v in verdicts) >= 0.95 * len(verdicts)
    # the key IS shifted on this code base: without the margin its rate at z = 4 is more than twice the stated one
    plain = np.array([(v.num_green_tokens - 0.25 * v.num_tokens_scored) / math.sqrt(v.num_tokens_scored * 0.1875)
                      for v in verdicts if v.num_tokens_scored])
    assert plain.mean() > DOUBLED + 2 * plain.std() / math.sqrt(plain.size)
    # with the bounded promise, the p-values the verdicts give imply at most twice the stated rate
    held = effective_z(verdicts)
    assert held.mean() <= DOUBLED
    flagged = sum(v.watermarked for v in verdicts)
    assert flagged <= binom.ppf(0.999, len(verdicts), ALPHA)


def test_the_kind_of_text_is_read_from_its_tokens(vocab):
    ids = np.asarray(vocab.tokenizer(CODE, add_special_tokens=False)["input_ids"], dtype=np.int64)
    assert promise.text_kind(vocab, ids) == promise.CODE
    ids = np.asarray(vocab.tokenizer(PROSE, add_special_tokens=False)["input_ids"], dtype=np.int64)
    assert promise.text_kind(vocab, ids) == promise.PROSE
    assert promise.text_kind(vocab, np.zeros(0, dtype=np.int64)) == promise.PROSE


def test_every_keyed_verdict_states_its_promise_and_what_it_costs(vocab):
    detector = Detector(vocab=vocab, keyring=OneKey())
    for text, kind in ((PROSE, promise.PROSE), (CODE, promise.CODE)):
        verdict = detector.detect(text, spec=SPEC, options=DetectOptions(windows=True))
        stated = verdict.to_dict()["promise"]
        margin = promise.BOUNDED_MARGIN["selfhash"][kind]
        assert stated["promise"] == promise.BOUNDED and stated["kind"] == kind and stated["margin"] == margin
        z_needed = -float(special.ndtri(verdict.alpha))  # the text's own threshold (alpha halved with windows)
        assert stated["z_needed"] == pytest.approx(z_needed + margin, abs=1e-3)
        assert stated["tokens_factor"] == pytest.approx(((z_needed + margin) / z_needed) ** 2, abs=1e-3)
        exact = p_value_binomial(verdict.num_green_tokens, verdict.num_tokens_scored, 0.25)
        assert verdict.p_value == pytest.approx(max(exact, p_value_normal(verdict.z_score - margin)))
        assert stated["raised"] == (verdict.p_value > exact)
        shown = verdict.disclose("detect")["promise"]  # a detect caller sees the promise, not whether it bit
        assert shown == {k: v for k, v in stated.items() if k != "raised"}
    public = Detector(vocab=vocab).detect(PROSE, spec="hf:greenlist_ratio=0.25,bias=2,hashing_key=15485863")
    assert public.promise is None  # a public spec's null is every key's: no fixed-key promise to state


def test_a_rate_of_one_half_or_more_states_no_tokens_factor(vocab):
    # z threshold 0 at fpr 1/2 (below 0 above it): no tokens are needed without the margin, so no factor is stated
    stated = Detector(vocab=vocab, keyring=OneKey()).detect(PROSE, spec=SPEC, options=DetectOptions(fpr=0.5)).promise
    assert stated["tokens_factor"] is None and stated["z_needed"] == pytest.approx(stated["margin"], abs=1e-3)


def test_the_evaluation_holds_each_prefix_to_the_promise_its_verdict_carries(vocab):
    detector = Detector(vocab=vocab, keyring=OneKey())
    mark = detector.watermarks(parse_spec(SPEC), ["k"])[0]
    for text in (PROSE, CODE):
        verdict = detector.detect(text, spec=SPEC)
        ids = np.asarray(vocab.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        margins = promise.prefix_margins(vocab, ids, "selfhash", None)
        held = prefix_p_values(mark, ids, common=common_units.for_vocabulary(vocab), margins=margins)
        assert held[-1] == pytest.approx(verdict.p_value)


def calibration_of(keyring, key_id: str, vocab) -> Calibration:
    """A calibration measured at N(0, 1) everywhere (no guard), under the shipped table, for ``key_id``."""
    info = next(k for k in keyring.list() if k.key_id == key_id)
    mark = Watermark(SPEC, keyring.secret(key_id), vocab.vocab_size, key_id=key_id)
    table = common_units.for_vocabulary(vocab)
    buckets = tuple(Bucket(i, 2000, 0.0, 1.0) for i in range(8))
    return Calibration(key_id, info.fingerprint, mark.spec.format(), mark.fingerprint, table.digest,
                       "2026-11-28T00:00:00Z", buckets, {}, {})


def test_your_texts_of_a_kind_lift_the_margin_for_that_kind_only(provmark_home, vocab, held_out_code):
    """``keys calibrate --corpus`` with code of the deployment's: verdicts on code carry the measured promise and its
    smaller margin; verdicts on prose, a kind the deployment did not show, stay bounded."""
    keyring = Keyring()
    keyring.create("k1", secret=SHIFTED_KEY)
    base = calibration_of(keyring, "k1", vocab)
    CalibrationStore(keyring).put(base)
    detector = Detector(vocab=vocab, keyring=keyring)
    before = detector.detect(CODE, keys=["k1"])
    assert before.promise["promise"] == promise.BOUNDED
    mark = Watermark(SPEC, SHIFTED_KEY, vocab.vocab_size, key_id="k1")
    ids = measuring.token_ids_of(vocab, held_out_code[0::2][:60])
    kinds = promise.kinds_of(vocab, ids)
    yours = measuring.with_your_texts(base, mark, ids, common_units.for_vocabulary(vocab), kinds=kinds)
    assert yours.domains["yours"]["kinds"]["code"]["n"] >= promise.MIN_MEASURED_TEXTS
    CalibrationStore(keyring).put(yours)
    after = Detector(vocab=vocab, keyring=keyring)
    code, prose = after.detect(CODE, keys=["k1"]), after.detect(PROSE, keys=["k1"])
    assert code.promise["promise"] == promise.MEASURED and code.promise["margin"] == promise.MEASURED_MARGIN["selfhash"]["code"]
    assert code.promise["margin"] < before.promise["margin"] and code.promise["tokens_factor"] < before.promise["tokens_factor"]
    assert code.p_value <= before.p_value  # the same evidence, held to the smaller margin
    assert prose.promise["promise"] == promise.BOUNDED
    # too few texts of a kind measure nothing: that kind stays bounded
    few = replace(yours, domains={**yours.domains, "yours": {**yours.domains["yours"],
                                                            "kinds": {"code": {"n": 5, "mean_z": 0.0, "sd_z": 1.0}}}})
    CalibrationStore(keyring).put(few)
    assert Detector(vocab=vocab, keyring=keyring).detect(CODE, keys=["k1"]).promise["promise"] == promise.BOUNDED


def test_picking_unigram_says_it_cannot_judge_code():
    assert "insufficient_text" in promise.spec_note(parse_spec("kgw:scheme=unigram"))
    assert promise.spec_note(parse_spec(None)) is None
    assert promise.spec_note(parse_spec("kgw:scheme=lefthash,h=1")) is None
