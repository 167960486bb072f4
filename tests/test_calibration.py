"""Per-key calibration: measured on human text, stored MACed beside the keyring, used by the detector as a
guard that can only make a verdict more careful, and reported on every verdict."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sampling_texts import PREFIX, as_text, word_ids

from api.cli import main
from detector import calibrate as measuring
from detector import calibration as cal
from detector import common_units
from detector.calibration import (
    Bucket,
    Calibration,
    CalibrationStore,
    CalibrationStoreError,
)
from detector.service import Detector
from watermark.config import WatermarkSpec
from watermark.keys import Keyring
from watermark.scheme import Watermark
from watermark.stats import Z_THRESHOLD, p_value_binomial, p_value_normal
from watermark.vocab import encode, load_vocabulary

SPEC = WatermarkSpec.default()


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


def shifted(calibration: Calibration, mean: float, sd: float = 1.0, n: int = 2000) -> Calibration:
    """The same calibration with every bucket and domain measured at N(mean, sd) over n texts."""
    return replace(calibration, buckets=tuple(Bucket(b.index, n, mean, sd) for b in calibration.buckets),
                   domains={d: {"n": n, "mean_z": mean, "sd_z": sd} for d in calibration.domains})


@pytest.fixture
def calibrated(provmark_home, vocab):
    """A keyring with one key and its real calibration under the default spec."""
    keyring = Keyring()
    info = keyring.create("k1")
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    result = measuring.calibrate(mark, info.fingerprint, vocab, common_units.for_vocabulary(vocab))
    CalibrationStore(keyring).put(result)
    return keyring, result


def test_calibration_measures_every_domain_and_length(calibrated):
    _, result = calibrated
    assert set(result.domains) == set(common_units.FIT_DOMAINS)
    measured = [b for b in result.buckets if b.n >= cal.MIN_BUCKET_TEXTS]
    assert len(measured) >= 6  # T from under 25 to over 800 scored units
    assert sum(b.n for b in result.buckets) == len(result.z_values) >= 2000
    # one key, thousands of human windows scored as the detector scores them: N(0, 1) within noise
    z = np.asarray(result.z_values)
    assert abs(z.mean()) <= 4 * 1.0 / math.sqrt(z.size) + 0.1  # 0.1: the key-to-key spread (test_key_soundness)
    assert 0.85 <= z.std() <= 1.15


def test_the_store_round_trips_and_refuses_an_edited_file(calibrated):
    keyring, result = calibrated
    store = CalibrationStore(keyring)
    again = store.get("k1", result.spec_fingerprint)
    assert again.calibration_id == result.calibration_id and again.buckets == result.buckets
    assert (keyring.home / cal.FILE_NAME).stat().st_mode & 0o077 == 0
    doc = json.loads((keyring.home / cal.FILE_NAME).read_text())
    doc["body"]["keys"]["k1"][result.spec_fingerprint]["buckets"][3][2] = -5.0  # a friendlier null
    (keyring.home / cal.FILE_NAME).write_text(json.dumps(doc))
    with pytest.raises(CalibrationStoreError):
        CalibrationStore(keyring).get("k1", result.spec_fingerprint)


@settings(max_examples=200, deadline=None)
@given(p=st.floats(0.0, 1.0), z=st.floats(-10, 40), total=st.integers(1, 10_000),
       mean=st.floats(-1.0, 1.0), sd=st.floats(0.5, 2.0), n=st.integers(0, 5000))
def test_the_guard_never_makes_a_verdict_less_careful(p, z, total, mean, sd, n):
    base = Calibration("k", "f", SPEC.format(), "fp", None, "t",
                       tuple(Bucket(i, n, mean, sd) for i in range(len(cal.BUCKET_EDGES))), {}, {})
    guarded, applied = cal.guarded_p_value(p, z, total, base)
    assert guarded >= p
    assert applied == (guarded > p)


def text_at_z(detector: Detector, mark: Watermark, low: float, high: float) -> str:
    """Whole single-token words, each chosen green under ``mark`` while the text's z is below ``low`` and red
    after, until at least 30 positions are scored and z lies in [low, high): a text at a z of our choosing."""
    vocab = detector.vocab
    words = word_ids(vocab)
    ids = encode(vocab, PREFIX)
    rng = np.random.default_rng(0)
    for _ in range(400):
        verdict = detector.detect(as_text(vocab, ids), keys=[mark.key_id])
        z = verdict.z_score
        if verdict.num_tokens_scored >= 30 and low <= z < high:
            return as_text(vocab, ids)
        green = mark.green_mask(torch.tensor([ids[-mark.context_width:]]))[0, words]
        wanted = [w for w, g in zip(words, green.tolist()) if g == (z < low)]
        ids.append(int(rng.choice(wanted)))
    raise AssertionError(f"no text with z in [{low}, {high}) within 400 words")


def test_a_key_whose_null_is_shifted_up_is_held_to_that_null(calibrated, vocab):
    """Give k1 a calibration whose buckets measure N(+1, 1): a text at z = 4.5 is no longer significant,
    and the verdict says which calibration held it."""
    keyring, result = calibrated
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    # the guard's p-value is P(N(0,1) >= (z - shift) / scale) with the shift reduced by 2 standard errors: at
    # z < Z_THRESHOLD + shift the guarded text is not significant
    shift = 1.0 - 2.0 / math.sqrt(2000)
    text = text_at_z(Detector(vocab=vocab, keyring=keyring), mark, 4.5, Z_THRESHOLD + shift)
    bad = shifted(result, mean=1.0)
    CalibrationStore(keyring).put(bad)
    assert not bad.passes_screen()
    verdict = Detector(vocab=vocab, keyring=keyring).detect(text, keys=["k1"])
    assert verdict.calibration["id"] == bad.calibration_id
    assert verdict.calibration["mean_z"] == pytest.approx(1.0)
    assert 4.5 <= verdict.z_score < Z_THRESHOLD + shift and verdict.calibration["guarded"] is True
    assert verdict.p_value >= p_value_normal(verdict.z_score - shift) * (1 - 1e-9)
    assert not verdict.watermarked
    # a calibration that measured N(0, 1) changes nothing
    sound = shifted(result, mean=0.0)
    CalibrationStore(keyring).put(sound)
    plain = Detector(vocab=vocab, keyring=keyring).detect(text, keys=["k1"])
    assert plain.calibration["id"] == sound.calibration_id and plain.calibration["guarded"] is False
    assert plain.z_score == verdict.z_score and plain.p_value < verdict.p_value


def test_a_calibration_measured_under_another_common_unit_table_is_not_used(calibrated, vocab):
    """A calibration is the null of the scoring it measured: after the common-unit table changes, the key
    counts as uncalibrated (verdicts say so) until `keys calibrate` measures it again."""
    keyring, result = calibrated
    stale = replace(shifted(result, mean=1.0), common_units="0123456789abcdef")
    CalibrationStore(keyring).put(stale)
    text = "The committee met on Tuesday to review the budget. " * 3
    verdict = Detector(vocab=vocab, keyring=keyring).detect(text, keys=["k1"])
    assert verdict.calibration is None
    CalibrationStore(keyring).put(shifted(result, mean=1.0))  # the same null under the current table is used
    assert Detector(vocab=vocab, keyring=keyring).detect(text, keys=["k1"]).calibration["mean_z"] == pytest.approx(1.0)


def test_the_guard_turns_a_borderline_verdict_when_the_key_is_measurably_shifted(calibrated, vocab):
    """A text the plain test calls watermarked at z just above 4 is not, under a key whose calibration
    measured its human null at N(+1, 1): that key's realised false-positive rate at z = 4 is ~40x the
    stated one, and the verdict is held to the null it really has."""
    import test_detector_stats as stats_tests

    keyring, result = calibrated
    CalibrationStore(keyring).put(shifted(result, mean=0.0))  # start from a key measured at N(0, 1)
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    pool = stats_tests.pool.__wrapped__(vocab)
    detector = Detector(vocab=vocab, keyring=keyring)
    # the null the guard will hold the verdict to: N(+1, 1) measured on 2,000 texts, shifted by its mean less
    # two standard errors (0.955). "Borderline" is z below the threshold plus that shift: z < 5.0 let a
    # random key pick z = 4.996, which the guard rightly still calls watermarked (flaky in CI, 2026-11-26)
    shift, _ = shifted(result, mean=1.0).buckets[0].guard
    for seed in range(200):  # the first seeded passage whose plain verdict is borderline
        ids = stats_tests.watermarked_ids(mark, pool, [], 60, 0.9, seed)
        text = vocab.tokenizer.decode(ids)
        verdict = detector.detect(text, keys=["k1"])
        if verdict.watermarked and verdict.z_score - shift < Z_THRESHOLD and verdict.calibration["guarded"] is False:
            break
    else:
        pytest.fail("no borderline passage among 200 seeds")
    CalibrationStore(keyring).put(shifted(result, mean=1.0))
    held = Detector(vocab=vocab, keyring=keyring).detect(text, keys=["k1"])
    assert held.z_score == verdict.z_score  # the evidence is the same ...
    assert held.calibration["guarded"] is True and held.p_value > verdict.p_value  # ... its weight is not
    assert held.verdict != "watermarked"


def test_screening_draws_again_until_a_key_passes(monkeypatch, vocab):
    draws = []
    real = measuring.calibrate

    def calibrate(mark, *args, **kwargs):
        result = real(mark, *args, **kwargs)
        draws.append(result)
        return shifted(result, mean=0.8 if len(draws) < 3 else 0.0)  # the third draw measures N(0, 1)

    monkeypatch.setattr(measuring, "calibrate", calibrate)
    secret, result, count = measuring.screened_secret(SPEC, vocab, common_units.for_vocabulary(vocab))
    assert count == 3 and result.passes_screen() and len(secret) == 32


def test_cli_calibrate_lists_plots_and_refuses_bad_input(provmark_home, capsys, tmp_path):
    assert main(["keys", "create", "a1", "--no-calibrate"]) == 0
    assert main(["keys", "list"]) == 0
    assert "none (provmark keys calibrate)" in capsys.readouterr().out
    png = tmp_path / "null.png"
    assert main(["keys", "calibrate", "a1", "--plot", str(png), "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out[0]["key_id"] == "a1" and len(out[0]["buckets"]) == len(cal.BUCKET_EDGES)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["keys", "list"]) == 0
    assert out[0]["id"] in capsys.readouterr().out
    assert main(["keys", "calibrate", "nope"]) != 0
    assert "no key nope" in capsys.readouterr().err
    assert main(["keys", "calibrate", "a1", "--spec", "hf:seeding_scheme=lefthash"]) != 0
    assert "hf specs have no secret key" in capsys.readouterr().err
    assert main(["keys", "calibrate", "a1", "--spec", "kgw:gamma=2"]) != 0
    assert "gamma" in capsys.readouterr().err


def test_batch_workers_hold_verdicts_to_the_same_calibration(calibrated, vocab):
    from detector.batch import DetectOptions, prepare_jobs, run_local

    keyring, result = calibrated
    CalibrationStore(keyring).put(shifted(result, mean=1.0))
    texts = ["The committee met on Tuesday to review the budget and the new roads plan for the region."] * 2
    prepared = prepare_jobs([{"text": t} for t in texts], DetectOptions(), keys=["k1"], vocab=vocab, keyring=keyring)
    batch = run_local(prepared, workers=1)
    single = Detector(vocab=vocab, keyring=keyring).detect(texts[0], keys=["k1"]).to_dict()
    assert batch[0]["calibration"] == single["calibration"] and batch[0]["p_value"] == single["p_value"]


def test_z_threshold_of_the_stated_rate():
    assert cal.Calibration("k", "f", SPEC.format(), "fp", None, "t", (), {}, {}).stated_fpr == p_value_normal(Z_THRESHOLD)


# ------------------------------------------------------------------ calibrating on the user's own texts
def collection(vocab, mark: Watermark, count: int, probes: int = 1) -> tuple[list[str], list[str]]:
    """``count`` human paragraphs (gensim's news) that all end with one shared line, as the files of one code base
    share its identifiers: the line is the one, among 40 drawn from rare words, whose units are greenest under
    ``mark``, so this key's null on the collection is shifted up. Returns (texts, ``probes`` more texts of the
    kind, never among the texts)."""
    import importlib.metadata
    import random
    import re

    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    paragraphs = [" ".join(line.split()[:60]) for line in open(path, encoding="utf-8") if len(line.split()) >= 60]
    pieces = vocab.tokenizer.convert_ids_to_tokens(list(range(vocab.vocab_size)))
    words = sorted({p[1:] for p in pieces if p and re.fullmatch(r"Ġ[a-z]{6,10}", p)})
    common = common_units.for_vocabulary(vocab)
    rng = random.Random(7)

    def mean_z(line: str) -> float:
        zs = []
        for paragraph in paragraphs[:8]:
            ids = measuring.token_ids_of(vocab, [f"{paragraph} {line}"])[0]
            zs.append(measuring.window_z(mark, __import__("torch").tensor(ids), common)[1])
        return float(np.mean(zs))

    lines = [" ".join(rng.sample(words, 12)) + "." for _ in range(40)]
    line = max(lines, key=mean_z)
    return [f"{p} {line}" for p in paragraphs[:count]], [f"{p} {line}" for p in paragraphs[count:count + probes]]


def test_your_texts_common_units_are_left_out_of_every_later_verdict(provmark_home, vocab, tmp_path, capsys):
    """The shipped corpora cannot know what one collection shares (a code base's identifiers, a publication's
    boilerplate): under a fixed key those units are coins every text of the collection tosses the same way, so
    the key's null there is shifted. ``keys calibrate --corpus`` counts the units the user's texts share and
    the detector leaves them out of every later verdict, as it does the shipped table's: on OTHER texts of the
    collection (never in the corpus) the key's mean z is back to the noise of a sample mean, 1/sqrt(n)."""
    keyring = Keyring()  # a fixed key: the collection's shared line is drawn for it
    keyring.create("k1", secret=hashlib.sha256(b"provmark-test/your-texts").digest())
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    texts, probes = collection(vocab, mark, 90, probes=100)
    folder = tmp_path / "ours"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # hidden: not a text of the collection
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")  # not text: skipped
    for i, text in enumerate(texts):
        (folder / f"{i:03d}.txt").write_text(text, encoding="utf-8")

    assert main(["keys", "calibrate", "k1", "--no-progress"]) == 0  # the shipped corpora only
    capsys.readouterr()
    def four_standard_errors(verdicts) -> float:
        return 4 * np.std([v.z_score for v in verdicts]) / np.sqrt(len(verdicts))

    before = [Detector(vocab=vocab, keyring=keyring).detect(p, keys=["k1"]) for p in probes]
    # the shared line's greens: the key's null on the collection is up, far beyond a sample mean's noise
    assert np.mean([v.z_score for v in before]) > four_standard_errors(before)

    assert main(["keys", "calibrate", "k1", "--corpus", str(folder), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "your texts' common units:" in out and "from 90 texts" in out and "your texts: 90 scored" in out
    detector = Detector(vocab=vocab, keyring=keyring)
    after = [detector.detect(p, keys=["k1"]) for p in probes]
    assert abs(np.mean([v.z_score for v in after])) <= four_standard_errors(after)
    assert all(a.num_common_positions > b.num_common_positions for a, b in zip(after, before))
    assert after[0].common_units != before[0].common_units  # the verdict names the table it was scored with
    stored = CalibrationStore(keyring).get("k1", mark.fingerprint)
    assert stored.common_units == after[0].common_units  # measured under that table: the detector uses it
    assert after[0].calibration is not None and after[0].calibration["id"] == stored.calibration_id
    assert main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)[0]["calibrations"]
    assert [c["stale"] for c in listed] == [False]
    assert main(["keys", "list"]) == 0
    assert "your texts' common units:" in capsys.readouterr().out

    # a batch of the same texts (workers shipped the table) gives the same verdicts
    from detector.batch import DetectOptions, prepare_jobs, run_local
    batch = run_local(prepare_jobs([{"text": p} for p in probes[:5]], DetectOptions(), keys=["k1"],
                                   vocab=vocab, keyring=keyring), workers=1)
    assert [b["z_score"] for b in batch] == [a.z_score for a in after[:5]]

    assert main(["keys", "calibrate", "k1", "--forget-corpus", "--no-progress"]) == 0
    assert "removed" in capsys.readouterr().out
    again = Detector(vocab=vocab, keyring=keyring).detect(probes[0], keys=["k1"])
    assert (again.z_score, again.common_units) == (before[0].z_score, before[0].common_units)


def test_each_corpus_path_counts_as_a_collection_of_its_own(provmark_home, vocab, tmp_path):
    """A deployment that judges a documentation set and a code base gives both (``--corpus docs --corpus src``).
    Counted as one collection, what a third of the documents share past their first window is diluted by the code
    base's thousands of windows and stays in every verdict; each path is also counted on its own, as the shipped
    table counts each collection of its corpora."""
    import importlib.metadata
    import os
    from pathlib import Path

    from api.cli.keys.corpus import read_collections

    keyring = Keyring()  # a fixed key: the shared line is drawn for it
    keyring.create("k1", secret=hashlib.sha256(b"provmark-test/your-texts").digest())
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    line = " ".join(collection(vocab, mark, 1)[0][0].split()[-12:])
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    with open(path, encoding="utf-8") as fh:  # a line is an article: its first 70 words are a paragraph
        paragraphs = [" ".join(p.split()[:70]) for p in fh if len(p.split()) >= 70]
    documents = ["\n\n".join(paragraphs[5 * i:5 * i + 3] + ([line] if i % 3 == 0 else []) + paragraphs[5 * i + 3:5 * i + 5])
                 for i in range(35)]  # the line, where a third of them have it, is past the first window
    docs, src = tmp_path / "docs", tmp_path / "src.jsonl"
    docs.mkdir()
    for i, text in enumerate(documents[:30]):
        (docs / f"{i:02d}.txt").write_text(text, encoding="utf-8")
    sources = sorted(p for p in Path(os.__file__).parent.glob("*.py") if p.stat().st_size > 20000)[:120]
    src.write_text("\n".join(json.dumps({"text": p.read_text(encoding="utf-8")[:20000]}) for p in sources) + "\n",
                   encoding="utf-8")
    collections = read_collections([str(docs), str(src)])
    assert [len(found) for found in collections] == [30, len(sources)]
    assert common_units.from_collections(vocab, collections[:1]).digest == common_units.from_texts(vocab, documents[:30]).digest
    pooled = common_units.from_texts(vocab, [text for found in collections for text in found])
    apart = common_units.from_collections(vocab, collections)
    probes = [d for i, d in enumerate(documents[30:], start=30) if i % 3 == 0]

    def left_out(table) -> list[int]:
        detector = Detector(vocab=vocab, keyring=keyring, your_units=table)
        return [detector.detect(p, keys=["k1"]).num_common_positions for p in probes]

    diluted, counted = left_out(pooled), left_out(apart)
    assert all(c >= d + 8 for c, d in zip(counted, diluted)), (counted, diluted)  # the line's 12 rare words


def test_the_evaluation_scores_with_the_deployments_table_of_your_texts_units(provmark_home, vocab):
    """``provmark eval`` measures the deployment's detector. Once the deployment has a table of its own texts' units,
    the evaluation's prefix curves (tokens to detect) and its null keys' verdicts must leave out the same units its
    verdicts do: the full-length prefix's p-value is the verdict's, and a null key's verdict names the same table."""
    from detector.your_units import YourUnits
    from evaluation.scorer import Scorer

    keyring = Keyring()  # a fixed key: the collection's shared line is drawn for it
    keyring.create("k1", secret=hashlib.sha256(b"provmark-test/your-texts").digest())
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    texts, probes = collection(vocab, mark, 90, probes=4)
    shipped_only = [Detector(vocab=vocab, keyring=keyring).detect(p, keys=["k1"]) for p in probes]
    YourUnits(keyring).put(common_units.from_texts(vocab, texts), len(texts))
    verdicts = [Detector(vocab=vocab, keyring=keyring).detect(p, keys=["k1"]) for p in probes]
    assert all(v.num_common_positions > s.num_common_positions for v, s in zip(verdicts, shipped_only))

    inline = Scorer(vocab, keyring, null_keys=2, seed=0)
    local = Scorer(vocab, keyring, null_keys=2, seed=0, detect_backend="local", workers=1)
    try:
        rows = inline.score(probes, SPEC, "k1", prefixes=True)
        assert [r["p_value"] for r in rows] == [v.p_value for v in verdicts]
        assert [r["prefix_p"][-1] for r in rows] == pytest.approx([v.p_value for v in verdicts], rel=1e-9)
        for scorer in (inline, local):  # the batch back end ships the null keys' workers the same table
            nulls = scorer.null_z_scores(probes, SPEC)
            null_verdicts = [scorer._nulls().detect(p, keys=[key], spec=SPEC) for key in scorer._null_ids for p in probes]
            assert {v.common_units for v in null_verdicts} == {verdicts[0].common_units}
            assert [v.z_score for v in null_verdicts] == nulls
    finally:
        inline.close()
        local.close()


def test_the_guard_holds_a_verdict_to_the_null_of_your_texts(provmark_home, vocab):
    """Where the user's texts still show a key's null shifted up (what the table of their units did not take
    away), the guard holds a verdict on such a text to that null: ``measured_on: yours``, guarded, a larger
    p-value on the same z. Here the calibration is measured on the collection under the shipped table alone, so
    the shared line's shift is left for the guard to see."""
    keyring = Keyring()  # a fixed key: the collection's shared line is drawn for it
    keyring.create("k1", secret=hashlib.sha256(b"provmark-test/your-texts").digest())
    mark = Watermark(SPEC, keyring.secret("k1"), vocab.vocab_size, key_id="k1")
    texts, probes = collection(vocab, mark, 90)
    shipped = common_units.for_vocabulary(vocab)
    base = measuring.for_key(measuring.calibrate(mark, keyring.list()[0].fingerprint, vocab, shipped), "k1")
    CalibrationStore(keyring).put(base)
    before = Detector(vocab=vocab, keyring=keyring).detect(probes[0], keys=["k1"])
    assert before.calibration["measured_on"] == "shipped"
    # held to the bounded promise's margin alone (detector.promise): the shipped null adds no shift of its own
    margin = before.promise["margin"]
    exact = p_value_binomial(before.num_green_tokens, before.num_tokens_scored, 0.25)
    assert before.p_value == pytest.approx(max(exact, p_value_normal(before.z_score - margin)))
    yours = measuring.with_your_texts(base, mark, measuring.token_ids_of(vocab, texts), shipped)
    measured = yours.domains["yours"]  # the shared line's greens: the key's null on the collection, measurably up
    assert measured["mean_z"] - 2 * measured["sd_z"] / math.sqrt(measured["n"]) > 0 and measured["buckets"]
    CalibrationStore(keyring).put(yours)
    after = Detector(vocab=vocab, keyring=keyring).detect(probes[0], keys=["k1"])
    assert after.z_score == before.z_score  # the evidence is the same ...
    assert after.calibration["measured_on"] == "yours" and after.calibration["guarded"] is True
    assert after.p_value > before.p_value  # ... its weight is the one this key has on such texts


def test_a_replaced_table_of_your_texts_units_stays_one_generation(provmark_home, vocab):
    """A running detector that read the record just before another process replaced the table must still find the
    file it names: the previous table stays until the next replacement, and older ones go."""
    from detector.your_units import YourUnits

    Keyring().ensure_active()
    store = YourUnits(Keyring())
    names = []
    for topic in ("harbour", "railway", "library"):
        table = common_units.from_texts(vocab, [f"Report {i}: the {topic} council approved the {topic} budget."
                                                for i in range(10)])
        names.append(store.put(table, 10)["file"])
        assert store.table(vocab.fingerprint).digest == table.digest
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(names[1:])  # the first is gone
    assert store.forget(vocab.fingerprint)["file"] == names[2]
    assert store.table(vocab.fingerprint) is None and (store.folder / names[2]).is_file()


def test_an_edited_table_of_your_texts_units_is_refused(provmark_home, vocab, tmp_path, capsys):
    """A forged table could leave out the red units of one text and raise its z: the table and its record are
    verified (the record, with the table's SHA-256 digest, is in the MACed calibration file), and an edited one
    is refused like a tampered keyring, never used."""
    from detector.your_units import FOLDER, YourUnitsError

    assert main(["keys", "create", "k1", "--no-calibrate"]) == 0
    corpus = tmp_path / "ours.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": f"Report {i}: the harbour council approved the budget."})
                                for i in range(40)) + "\n", encoding="utf-8")
    assert main(["keys", "calibrate", "k1", "--corpus", str(corpus), "--no-progress"]) == 0
    keyring = Keyring()
    Detector(vocab=vocab, keyring=keyring).detect("The harbour council met on Monday.", keys=["k1"])
    [table] = (provmark_home / FOLDER).iterdir()
    good = table.read_bytes()
    record = json.loads((provmark_home / cal.FILE_NAME).read_text())
    record["body"]["your_units"][vocab.fingerprint]["texts"] = 41
    (provmark_home / cal.FILE_NAME).write_text(json.dumps(record))
    with pytest.raises(CalibrationStoreError, match="does not verify"):
        Detector(vocab=vocab, keyring=keyring).detect("The harbour council met on Monday.", keys=["k1"])
    assert main(["keys", "calibrate", "k1", "--no-progress"]) != 0
    assert "does not verify" in capsys.readouterr().err

    assert main(["keys", "calibrate", "k1", "--corpus", str(corpus), "--no-progress"]) != 0  # not overwritten
    (provmark_home / cal.FILE_NAME).unlink()
    assert main(["keys", "calibrate", "k1", "--corpus", str(corpus), "--no-progress"]) == 0
    [table] = (provmark_home / FOLDER).iterdir()
    assert table.read_bytes() == good  # the same texts, the same table
    from detector.common_units import CommonUnits
    forged = CommonUnits.load(table)
    CommonUnits(forged.identities[1:], forged.frequencies[1:], forged.tokenizer_fingerprint,
                forged.window_tokens).save(table)
    with pytest.raises(YourUnitsError, match="does not match its record"):
        Detector(vocab=vocab, keyring=keyring).detect("The harbour council met on Monday.", keys=["k1"])


def test_calibrating_on_your_texts_refuses_bad_input_and_keeps_what_is_stored(provmark_home, vocab, tmp_path, capsys):
    assert main(["keys", "create", "k1", "--no-calibrate"]) == 0
    assert main(["keys", "calibrate", "k1", "--no-progress"]) == 0
    capsys.readouterr()
    keyring = Keyring()
    stored = (provmark_home / cal.FILE_NAME).read_bytes()
    bad_line = tmp_path / "texts.jsonl"
    bad_line.write_text('{"text": "a human sentence"}\n["not", "an", "object"]\n', encoding="utf-8")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"\xff\xfe\x00binary")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("  \n", encoding="utf-8")
    for args, message in [([str(tmp_path / "missing")], "no such file or directory"),
                          ([str(bad_line)], 'texts.jsonl:2: expected an object with a string "text" field'),
                          ([str(binary)], "not UTF-8 text"),
                          ([str(empty)], "no text found")]:
        assert main(["keys", "calibrate", "k1", "--no-progress", "--corpus", *args]) != 0
        assert message in capsys.readouterr().err
    assert (provmark_home / cal.FILE_NAME).read_bytes() == stored  # nothing measured, nothing written
    good = tmp_path / "good.jsonl"
    good.write_text("\n".join(json.dumps({"text": text}) for text in (
        "The council approved the harbour budget after a long night of debate.",
        "Rain is expected across the south coast, with flooding likely near rivers.",
        "A new library opened downtown; its reading rooms stay open until midnight.")) + "\n", encoding="utf-8")
    assert main(["keys", "calibrate", "k1", "--no-progress", "--corpus", str(good)]) == 0
    assert "your texts: 3 scored" in capsys.readouterr().out
    assert CalibrationStore(keyring).for_key("k1")[0].corpus["yours"] == 3


def test_a_key_created_with_your_texts_is_screened_on_them(provmark_home, vocab, tmp_path, monkeypatch, capsys):
    """Each candidate key is measured on the user's texts too, so a key whose null is shifted on the collection it
    will judge is drawn again, even when the shipped corpora pass it (``screened_secret(..., your_ids=)``). ``keys
    create --corpus`` first stores the texts' common units (as ``keys calibrate --corpus``) and screens under the
    table the detector will score with: what the collection shares no longer moves the key's null there."""

    secrets = [hashlib.sha256(f"screen-on-yours/{i}".encode()).digest() for i in range(measuring.SCREEN_TRIES)]
    first = Watermark(SPEC, secrets[0], vocab.vocab_size, key_id="candidate")
    common = common_units.for_vocabulary(vocab)
    assert measuring.calibrate(first, "f", vocab, common).passes_screen()  # the shipped corpora let it through
    texts, probes = collection(vocab, first, 90)  # ... but these texts share a line green under it
    drawn = iter(secrets)
    monkeypatch.setattr(measuring, "new_secret", lambda: next(drawn))
    _, shipped_only, draws = measuring.screened_secret(WatermarkSpec.default(), vocab, common,
                                                       your_ids=measuring.token_ids_of(vocab, texts))
    assert draws >= 2 and shipped_only.domains["yours"]["mean_z"] < 0.3  # under the shipped table: redrawn
    folder = tmp_path / "ours"
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    drawn = iter(secrets)
    assert main(["keys", "create", "k1", "--corpus", str(folder), "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    # with the collection's common units left out, the first candidate is not shifted there any more
    assert out["calibration"]["screening_draws"] == 1 and out["calibration"]["your_texts"] == len(texts)
    keyring = Keyring()
    assert keyring.secret("k1") == secrets[0]
    stored = CalibrationStore(keyring).for_key("k1")[0]
    yours = stored.domains["yours"]
    assert stored.passes_screen()
    assert abs(yours["mean_z"]) - 2 * yours["sd_z"] / math.sqrt(yours["n"]) <= cal.SCREEN_SHIFT
    verdict = Detector(vocab=vocab, keyring=keyring).detect(probes[0], keys=["k1"])
    assert verdict.common_units == stored.common_units != common.digest and verdict.calibration["id"] == stored.calibration_id
    # a corpus needs screening, and an existing standby key is measured with `keys calibrate`
    assert main(["keys", "create", "k2", "--no-calibrate", "--corpus", str(folder)]) != 0
    assert "cannot go with --no-calibrate" in capsys.readouterr().err
    assert main(["keys", "create", "k3", "--no-calibrate"]) == 0
    assert main(["keys", "rotate", "k3", "--corpus", str(folder)]) != 0
    assert "keys calibrate k3 --corpus" in capsys.readouterr().err
    assert keyring.active().key_id == "k1"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3000), st.floats(-2, 2), st.floats(0.5, 2), st.integers(0, 3000), st.floats(-2, 2),
       st.floats(0.5, 2))
def test_your_texts_never_make_a_length_bucket_less_careful(n1, mean1, sd1, n2, mean2, sd2):
    def fpr(bucket: Bucket) -> float:  # written out: the property checks Bucket.guarded_fpr too
        shift, scale = bucket.guard
        return p_value_normal((Z_THRESHOLD - shift) / scale)

    shipped, yours = Bucket(2, n1, mean1, sd1), Bucket(2, n2, mean2, sd2)
    kept = measuring.more_careful(shipped, yours, Z_THRESHOLD)
    assert fpr(kept) >= fpr(shipped)
    assert kept is shipped or kept.n >= cal.MIN_BUCKET_TEXTS


def test_a_running_detector_sees_a_calibration_written_since(calibrated, vocab):
    """The detector parses a key's calibration once per version of the file (each verdict used to parse it again
    and hash it for its id): a `keys calibrate` in another process must still reach the next verdict."""
    keyring, result = calibrated
    detector = Detector(vocab=vocab, keyring=keyring)
    text = "The committee met on Tuesday to review the budget. " * 3
    first = detector.detect(text, keys=["k1"]).calibration
    assert first["id"] == result.calibration_id
    assert detector.detect(text, keys=["k1"]).calibration == first  # parsed once, the same answer
    newer = shifted(result, mean=1.0)
    CalibrationStore(keyring).put(newer)  # another writer: a store object of its own
    seen = detector.detect(text, keys=["k1"]).calibration
    assert seen["id"] == newer.calibration_id != first["id"] and seen["mean_z"] == pytest.approx(1.0)
    assert replace(newer, z_threshold=3.0).calibration_id != newer.calibration_id  # a changed field, a new id
