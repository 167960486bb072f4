"""The default spec's code_delta: a stronger bias while the output being generated reads as code
(watermark.text_kind), so code from a low-entropy model is detected at 200 tokens; prose keeps delta."""

import numpy as np
import pytest
import torch

from api.cli.main import main as cli_main
from generation.sample import LogitsPipeline, StepRows
from generation.sample.params import SamplerState
from generation.sample.sampler import SamplingParams
from watermark.config import DEFAULT_CODE_DELTA, SpecError, WatermarkSpec
from watermark.processor import WatermarkProcessor
from watermark.scheme import Watermark
from watermark.text_kind import CODE_SHARE, MIN_GENERATED, generated_as_code

V = 64
KEY = bytes(range(32))
OLD_DEFAULT = "kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,prf=hmac-sha256"
CODEISH = np.zeros(V, dtype=np.uint8)
CODEISH[:8] = 1  # tokens 0..7 read as code in these tests


def test_the_default_spec_carries_code_delta_and_writes_it_out():
    spec = WatermarkSpec.default()
    assert spec.code_delta == DEFAULT_CODE_DELTA > spec.delta
    assert WatermarkSpec.parse(spec.format()) == spec
    assert f"code_delta={DEFAULT_CODE_DELTA!r}" in spec.format()


def test_a_spec_written_before_code_delta_reads_as_it_did():
    """Keys are bound to their spec string: one without code_delta keeps its text, fingerprint and one bias."""
    spec = WatermarkSpec.parse(OLD_DEFAULT)
    assert spec.code_delta is None and spec.format() == OLD_DEFAULT
    assert spec.delta_for(code=True) == spec.delta_for(code=False) == 2.0
    # the fingerprint leaves code_delta out: stored calibrations keyed by it serve keys bound with or without it
    assert WatermarkSpec.default().fingerprint(V) == spec.fingerprint(V)


@pytest.mark.parametrize("text, field", [
    ("kgw:code_delta=-1", "code_delta"), ("kgw:code_delta=nan", "code_delta"), ("kgw:code_delta=101", "code_delta"),
    ("kgw:code_delta", "code_delta")])
def test_bad_code_delta_is_refused_naming_the_field(text, field):
    with pytest.raises(SpecError, match=field):
        WatermarkSpec.parse(text)


def test_hf_specs_take_no_code_delta():
    with pytest.raises(SpecError, match="code_delta"):
        WatermarkSpec(kind="hf", scheme="lefthash", context_width=1, code_delta=3.0)


def test_cli_refuses_a_bad_code_delta_with_a_message(capsys):
    assert cli_main(["keys", "create", "--watermark", "kgw:code_delta=abc", "--json"]) != 0
    assert "code_delta" in capsys.readouterr().err


def test_output_reads_as_code_from_min_generated_tokens_at_the_code_share():
    assert not generated_as_code(MIN_GENERATED - 1, MIN_GENERATED - 1)  # too few tokens to say
    n = 100
    assert generated_as_code(int(np.ceil(CODE_SHARE * n)), n)
    assert not generated_as_code(int(np.ceil(CODE_SHARE * n)) - 1, n)


def _green_offsets(mark, logits, histories, code):
    before = logits.clone()
    WatermarkProcessor().apply(logits, histories, [mark] * len(histories), code)
    return logits - before


def test_rows_flagged_as_code_get_code_delta_and_the_rest_delta_on_the_same_green_list():
    mark = Watermark(str(WatermarkSpec.default()), KEY, V)
    histories = [[5, 9, 11, 13, 2], [5, 9, 11, 13, 2], [1, 2, 3, 4, 20]]
    offsets = _green_offsets(mark, torch.zeros(3, V), histories, [True, False, True])
    assert torch.equal(offsets[0] > 0, offsets[1] > 0)  # same context, same green list
    assert set(offsets[0].unique().tolist()) == {0.0, DEFAULT_CODE_DELTA}
    assert set(offsets[1].unique().tolist()) == {0.0, 2.0}
    alone = _green_offsets(mark, torch.zeros(1, V), histories[2:], [True])
    assert torch.equal(offsets[2], alone[0])  # a row's bias does not depend on its batch-mates' kinds


def test_the_pipeline_reads_each_row_s_own_output():
    """A row that writes codeish tokens gets code_delta; one writing prose, and one too short to say, get delta."""
    mark = Watermark(str(WatermarkSpec.default()), KEY, V)
    prompt = [40, 41, 42, 43, 44]
    outputs = [[1, 50] * 10, [50, 51] * 10, [1, 2, 3]]
    states = []
    for out in outputs:
        state = SamplerState(SamplingParams(), prompt, {63})
        for token in out:
            state.append(token)
        states.append(state)
    pipeline = LogitsPipeline(V, "cpu", CODEISH)
    rows = StepRows.of(states, [mark] * 3)
    assert pipeline.code_rows(rows) == [True, False, False]
    scores = pipeline.watermark_(torch.zeros(3, V), rows)
    assert scores[0].max().item() == DEFAULT_CODE_DELTA
    assert scores[1].max().item() == scores[2].max().item() == 2.0
    # without a kind table (vLLM's rows) every row gets delta; a spec without code_delta never asks
    assert LogitsPipeline(V, "cpu").code_rows(rows) is None
    plain = Watermark(OLD_DEFAULT, KEY, V)
    assert pipeline.code_rows(StepRows.of(states, [plain] * 3)) is None
