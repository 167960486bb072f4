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

from detector import common_units, scoring, scoring_kernel
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


def python_path(monkeypatch, *args, **kwargs):
    with monkeypatch.context() as m:
        m.setattr(scoring, "kgw_scores", lambda *a: None)
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


@pytest.mark.parametrize("spec_text", [None, SPECS[5], SPECS[8]])
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
            fast = detector.detect(text, spec=spec_text, explain=True, windows=True).to_dict()
            with monkeypatch.context() as m:
                m.setattr(scoring, "kgw_scores", lambda *a: None)
                slow = detector.detect(text, spec=spec_text, explain=True, windows=True).to_dict()
            assert fast == slow


def test_the_kernel_is_built_where_a_compiler_is():
    assert scoring_kernel.available()


def test_out_of_range_token_ids_take_the_python_path(vocab):
    wm = Watermark(WatermarkSpec.parse(SPECS[0]), b"k" * 32, vocab.vocab_size, "k")
    assert scoring_kernel.kgw_scores(wm, torch.tensor([1, 2, 3, 4, 5, vocab.vocab_size]), None, True) is None
    assert scoring_kernel.kgw_scores(wm, torch.tensor([1, 2, 3, 4, 5, -1]), None, True) is None
