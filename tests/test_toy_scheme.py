"""Adding a scheme is one module and one registry line: the toy scheme (tests/toy_scheme.py) registered with
``schemes.register`` generates through the engine's sampling pipeline (random logits, no model), is detected by
the one verdict builder, and names itself in the verdict; the old spellings of two family names still work."""

import pytest
import torch
import toy_scheme
from http_fixtures import shared_vocabulary

from detector.normalize import normalize
from detector.sampling_verdict import score_sampling
from detector.scoring_request import DetectOptions, ScoringRequest
from generation.sample import LogitsPipeline, StepRows
from generation.sample.params import SamplerState, SamplingParams
from watermark import schemes
from watermark.scheme import make_watermark
from watermark.specs import parse_spec

SECRET = bytes(range(32))
VOCAB = 64  # the toy's own small vocabulary: ids 0..63


@pytest.fixture
def toy():
    family = schemes.register(toy_scheme.FAMILY)  # the one registry line
    yield family
    schemes.unregister(family)


def generate(mark, steps: int, seed: int) -> list[int]:
    pipeline = LogitsPipeline(VOCAB, "cpu")
    state = SamplerState(SamplingParams(seed=seed, temperature=1.0), [1, 2, 3], {0})
    logits = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = pipeline.sample(torch.randn(1, VOCAB, generator=logits) * 2.0, StepRows.of([state], [mark]))
        state.append(int(out.token_ids[0]))
    return state.history[state.prompt_len:]


def verdict_of(mark, ids: list[int]):
    vocab = shared_vocabulary()
    text = " ".join(str(i) for i in ids)  # the verdict's digest is of a text; the scored ids are these
    spec = mark.spec
    request = ScoringRequest(text=text, normalized=normalize(text, False), ids=torch.tensor(ids), offsets=None,
                             marks=[mark], spec=spec, vocab=vocab, options=DetectOptions(explain=False).scoring(),
                             calibrations=[None], common=None)
    return score_sampling(request).verdict


def test_a_registered_toy_scheme_generates_detects_and_shows_in_the_verdict(toy):
    spec = parse_spec("toy:h=1")  # parsed by its own family, through the registry
    assert isinstance(spec, toy_scheme.ToySpec) and schemes.family_of(spec) is toy and schemes.is_sampling(spec)
    mark = make_watermark(spec, SECRET, VOCAB, key_id="k-toy")
    assert isinstance(mark, toy_scheme.ToyMark)

    marked = generate(mark, 200, seed=7)
    plain = generate(None, 200, seed=7)
    assert marked != plain  # the toy chose the tokens

    found = verdict_of(mark, marked)
    assert found.verdict == "watermarked" and found.watermark == "toy:h=1" and found.key_id == "k-toy"
    assert found.statistic["name"] == "gumbel_sum" and found.fingerprint == spec.fingerprint(VOCAB)
    other = make_watermark(spec, bytes(32), VOCAB, key_id="k-other")
    assert verdict_of(other, marked).verdict != "watermarked"  # another key does not see it
    assert verdict_of(mark, plain).verdict != "watermarked"  # nor does the key in text it did not choose


def test_a_family_name_or_prefix_is_taken_once(toy):
    with pytest.raises(ValueError, match="taken"):
        schemes.register(toy_scheme.ToyFamily())


@pytest.mark.parametrize("old, new", [("hf-synthid", "hf:synthid"), ("vllm-gumbel", "vllm:gumbel")])
def test_old_family_spellings_work_for_one_release_with_a_deprecation(old, new):
    with pytest.deprecated_call():
        assert schemes.family_named(old).name == new
    assert schemes.family_named(new).name == new
