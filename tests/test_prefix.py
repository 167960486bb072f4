"""Prefix p-values (evaluation.prefix) equal the detector's own p-value of each prefix pasted alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from detector import common_units, scoring_sampling
from detector.scoring import Decision
from evaluation.prefix import prefix_p_values
from watermark.scheme import make_watermark
from watermark.vocab import encode, load_vocabulary

SECRET = bytes(range(32))


@pytest.fixture(scope="module")
def vocab():
    return load_vocabulary()


@pytest.fixture(scope="module")
def human_ids(vocab):
    import importlib.metadata
    from pathlib import Path

    path = importlib.metadata.distribution("gensim").locate_file("gensim/test/test_data/lee_background.cor")
    return encode(vocab, Path(str(path)).read_text(encoding="utf-8")[:3000])[:300]


@pytest.mark.parametrize("spec", ["gumbel:h=4", "synthid:h=3,layers=12", "vllm:gumbel,context_width=2"])
def test_sampling_prefix_p_values_equal_the_detectors_on_each_prefix(vocab, human_ids, spec):
    mark = make_watermark(spec, SECRET, vocab.vocab_size, key_id="k")
    common = common_units.for_vocabulary(vocab)
    ids = list(human_ids)
    # repeat a stretch so dedup matters
    ids = ids[:200] + ids[40:90]
    p = prefix_p_values(mark, ids, common=common)
    assert p.shape == (len(ids) + 1,)
    for length in (mark.context_width, mark.context_width + 1, 50, 120, 200, len(ids)):
        expected = scoring_sampling.score_text(mark, torch.tensor(ids[:length]), common=common).p_value
        assert p[length] == pytest.approx(expected, rel=1e-9, abs=1e-300), length


def test_kgw_prefix_p_values_keep_the_detector_rule(vocab, human_ids):
    from evaluation.metrics import prefix_detection

    mark = make_watermark("kgw:scheme=selfhash,h=4", SECRET, vocab.vocab_size, key_id="k")
    p = prefix_p_values(mark, human_ids, common=common_units.for_vocabulary(vocab))
    assert np.all((p >= 0) & (p <= 1))
    alpha = Decision.make().alpha
    assert np.array_equal(prefix_detection(mark, human_ids, alpha, common=common_units.for_vocabulary(vocab)),
                          p <= alpha)
