"""The C scoring pass of the keyed kgw schemes (``detector.scoring_kernel``) gives exactly the arrays of the
Python path it replaces: flags, previous occurrences (with the common-unit table's left-out positions), units
and identities, on human text, on text full of repeated tokens (ties in the keyed min) and on tiny texts."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from detector import common_units, scoring, scoring_kernel, unit_lookup
from detector.scoring_request import DetectOptions
from detector.service import Detector
from watermark.config import WatermarkSpec
from watermark.public_key import public_half_secret
from watermark.scheme import Watermark
from watermark.vocab import encode, load_vocabulary

# CI installs a compiler: there the kernel must build, and the tests fail when it does not
pytestmark = pytest.mark.skipif(not scoring_kernel.available() and not os.environ.get("CI"),
                                reason="no C compiler: the Python path is the only one")

SPECS = ("kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0", "kgw:scheme=minhash,h=4,gamma=0.25,delta=2.0",
         "kgw:scheme=selfhash,h=2,gamma=0.5,delta=2.0", "kgw:scheme=minhash,h=1,gamma=0.5,delta=2.0",
         "kgw:scheme=selfhash,h=1,gamma=0.1,delta=2.0", "kgw:scheme=lefthash,h=1,gamma=0.25,delta=2.0",
         "kgw:scheme=lefthash,h=4,gamma=0.5,delta=2.0", "kgw:scheme=lefthash,h=5,gamma=0.25,delta=2.0",
         "kgw:scheme=unigram,gamma=0.25,delta=2.0", "kgw:scheme=lefthash,h=2,gamma=0.25,delta=2.0,prf=sha3-256",
         "kgw:scheme=selfhash,h=3,gamma=0.25,delta=2.0,prf=sha3-256")


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


@pytest.fixture(scope="module")
def texts(vocab):
    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    ids = encode(vocab, Path(str(path)).read_text(encoding="utf-8"))
    rng = np.random.default_rng(7)
    human = [ids[i:i + n] for i, n in ((0, 1000), (5000, 300), (9000, 57), (12000, 5), (15000, 6))]
    repeats = [list(rng.integers(0, 6, 400)), [13] * 50, list(rng.integers(0, 49152, 200)) * 3]  # ties, dedup
    return [torch.tensor(t, dtype=torch.int64) for t in human + repeats]


def without_kernel(m):
    """The Python path: no scoring pass in C, and the common-unit table searched in numpy."""
    m.setattr(scoring, "kgw_scores", lambda *a: None)
    m.setattr(common_units, "common_frequencies", lambda *a: None)


def python_path(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        without_kernel(m)
        return scoring.score_positions(*args, **kwargs)


@pytest.mark.parametrize("spec_text", SPECS)
@pytest.mark.parametrize("with_table", [True, False])
@pytest.mark.parametrize("dedup", [True, False])
def test_the_kernel_gives_the_python_paths_arrays(monkeypatch, vocab, texts, spec_text, with_table, dedup):
    spec = WatermarkSpec.parse(spec_text)
    common = common_units.for_spec(spec, vocab) if with_table else None
    for seed in range(3):
        wm = Watermark(spec, bytes([seed]) * 32, vocab.vocab_size, "k")
        for ids in texts:
            fast = scoring.score_positions(wm, ids, common, dedup, with_units=True, with_identities=True)
            slow = python_path(monkeypatch, wm, ids, common, dedup, with_units=True, with_identities=True)
            assert scoring_kernel.kgw_scores(wm, ids, common, dedup) is not None or ids.shape[0] <= spec.context_width
            assert len(fast) == len(slow) == 4
            for a, b in zip(fast, slow):
                assert a.dtype == b.dtype and a.shape == b.shape
                np.testing.assert_array_equal(a, b)
            if common is not None and ids is texts[0] and "h=5" not in spec_text:  # 1,000 tokens of news (h=5: unnamed)
                assert (fast[1] == np.arange(fast[1].shape[0])).any()  # the table left something out


@pytest.mark.parametrize("spec_text", [None, SPECS[5], SPECS[8], "gumbel:h=4", "synthid:h=4"])
def test_verdicts_are_the_same_with_and_without_the_kernel(monkeypatch, vocab, texts, spec_text):
    """Whole verdicts (one- and two-part keys), every field, as the service returns them."""

    class OneKey:
        path = Path("/nonexistent/keyring.json")

        def __init__(self, two_part):
            self.two_part = two_part

        def public_half_of(self, key_id):
            return public_half_secret(b"s" * 32) if self.two_part else None

        def detection_keys(self):
            return [type("Info", (), {"key_id": "k"})()]

        def secret(self, key_id):
            return b"s" * 32

    words = [vocab.tokenizer.decode(t.tolist()) for t in texts[:3]]
    for two_part in (False, True):
        detector = Detector(vocab=vocab, keyring=OneKey(two_part))
        for text in words:
            fast = detector.detect(text, spec=spec_text, options=DetectOptions(explain=True, windows=True)).to_dict()
            with monkeypatch.context() as m:
                without_kernel(m)
                slow = detector.detect(text, spec=spec_text, options=DetectOptions(explain=True, windows=True)).to_dict()
            assert fast == slow


def numpy_frequencies(monkeypatch, table, ids):
    with monkeypatch.context() as m:
        m.setattr(common_units, "common_frequencies", lambda *a: None)
        return table.frequency_of(ids)


def test_the_kernels_table_lookup_gives_the_numpy_frequencies(monkeypatch, vocab, texts):
    """``CommonUnits.frequency_of`` (every spec's exclusions outside the kgw pass, the evaluation's prefixes):
    the packed table searched in C, against numpy's own table at another load, so other probe sequences."""
    table = common_units.for_spec(WatermarkSpec.default(), vocab)
    assert scoring_kernel.common_frequencies(table.identities[:3], *unit_lookup.packed_hash_table(table)) is not None
    rng = np.random.default_rng(3)
    known = table.identities
    queries = [known, known + np.uint64(1), rng.integers(0, 2**64, 100_000, dtype=np.uint64),
               np.zeros(5, dtype=np.uint64), np.zeros(0, dtype=np.uint64)]
    for spec_text in ("gumbel:h=4", "synthid:h=4", SPECS[0], SPECS[5], SPECS[8]):
        wm = Watermark(WatermarkSpec.parse(spec_text), b"k" * 32, vocab.vocab_size, "k") \
            if spec_text.startswith("kgw") else None
        if wm is not None:
            queries.append(np.asarray(wm.unit_identities(texts[0]), dtype=np.uint64))
    for ids in queries:
        fast = table.frequency_of(ids)
        slow = numpy_frequencies(monkeypatch, table, ids)
        assert fast.dtype == slow.dtype == np.float32 and fast.shape == slow.shape
        np.testing.assert_array_equal(fast, slow)
    assert (table.frequency_of(known) == table.frequencies).all()  # every entry found, with its own frequency
    # a table small enough that identities collide on their low bits: long probe sequences, and misses after them
    crowded = common_units.CommonUnits(np.sort(np.arange(1, 40, dtype=np.uint64) * np.uint64(64)),
                                       np.linspace(0.001, 0.5, 39, dtype=np.float32), "test", 200)
    probe = np.concatenate([crowded.identities, crowded.identities + np.uint64(1), np.arange(0, 4096, dtype=np.uint64)])
    np.testing.assert_array_equal(crowded.frequency_of(probe), numpy_frequencies(monkeypatch, crowded, probe))
    assert (crowded.frequency_of(crowded.identities) == crowded.frequencies).all()


def test_the_kernel_is_built_where_a_compiler_is():
    assert scoring_kernel.available()


def test_out_of_range_token_ids_take_the_python_path(vocab):
    wm = Watermark(WatermarkSpec.parse(SPECS[0]), b"k" * 32, vocab.vocab_size, "k")
    assert scoring_kernel.kgw_scores(wm, torch.tensor([1, 2, 3, 4, 5, vocab.vocab_size]), None, True) is None
    assert scoring_kernel.kgw_scores(wm, torch.tensor([1, 2, 3, 4, 5, -1]), None, True) is None
