"""The vLLM plugin's logic without vLLM: per-request watermarks and persistent-batch bookkeeping
give exactly the bias our own WatermarkProcessor gives for the same histories."""

import pytest
import torch

from generation.vllm.rows import (
    KEY_ID_ARG,
    WATERMARK_ARG,
    RequestWatermarks,
    WatermarkedBatch,
    WatermarkRequest,
)
from watermark.config import WatermarkSpec
from watermark.key_info import KeyNotFoundError
from watermark.processor import WatermarkProcessor
from watermark.scheme import generation_watermark

V = 49152
LEFT = "kgw:scheme=lefthash,h=1,gamma=0.5,delta=3.0"
HF = "hf:seeding_scheme=lefthash,greenlist_ratio=0.25,bias=2.0"


def _ids(n, seed):
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _expected(logits, histories, requests, ring, vocab=V):
    marks = [None if r is None else generation_watermark(r.spec, vocab, key_id=r.key_id,
                                                         keyring=ring if r.spec.needs_key else None)
             for r in requests]
    out = logits.clone()
    WatermarkProcessor().apply(out[:, :vocab], histories, marks)
    return out


def test_bias_equals_our_processor_on_a_mixed_batch(keyring):
    extra = [None, {WATERMARK_ARG: "off"}, {KEY_ID_ARG: "beta"}, {WATERMARK_ARG: LEFT},
             {WATERMARK_ARG: HF}, {}, {WATERMARK_ARG: "kgw:h=4,hard"}]
    prompts = [_ids(9, 1), _ids(3, 2), _ids(3, 3), _ids(7, 4), _ids(5, 5), [], _ids(6, 7)]
    outputs = [_ids(6, 10), [], _ids(1, 11), _ids(3, 12), _ids(2, 13), _ids(2, 14), _ids(9, 15)]
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    batch.update([], [(i, extra[i], prompts[i], outputs[i]) for i in range(len(extra))], [])
    logits = torch.randn(len(extra), V, generator=torch.Generator().manual_seed(20))
    requests = [WatermarkRequest.from_extra_args(e) for e in extra]
    requests = [None if r.spec is None else r for r in requests]
    histories = [p + o for p, o in zip(prompts, outputs)]
    expected = _expected(logits, histories, requests, keyring)
    original = logits.clone()
    assert torch.equal(batch.apply(logits), expected)
    logits = original
    changed = [not torch.equal(expected[i], logits[i]) for i in range(len(extra))]
    assert changed == [True, False, True, True, True, False, True]  # row 5: 2 tokens < h = 4
    assert batch.watermark_at(1) is None and batch.watermark_at(5).key_id == "alpha"  # default: active key


def test_padded_logits_are_biased_on_the_vocabulary_columns_only(keyring):
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    history = _ids(8, 30)
    batch.update([], [(0, None, history[:5], history[5:])], [])
    logits = torch.randn(1, V + 64, generator=torch.Generator().manual_seed(31))
    expected = _expected(logits, [history], [WatermarkRequest(WatermarkSpec.default(), None)], keyring)
    assert torch.equal(batch.apply(logits), expected)
    assert torch.equal(expected[:, V:], logits[:, V:])


def test_rows_follow_removes_moves_swaps_and_live_output_lists(keyring):
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    outs = [_ids(5, 40 + i) for i in range(4)]
    args = [{}, {KEY_ID_ARG: "beta"}, {WATERMARK_ARG: LEFT}, {WATERMARK_ARG: "off"}]
    batch.update([], [(i, args[i], _ids(4, 50 + i), outs[i]) for i in range(4)], [])
    assert [batch.watermark_at(i).key_id if batch.watermark_at(i) else None for i in range(4)] == \
        ["alpha", "beta", "alpha", None]
    # removed, then added into the freed index, then moves: vLLM's processing order
    batch.update([0], [(0, {WATERMARK_ARG: "off"}, [1, 2], [])], [(1, 0, True), (2, 3, False)])
    assert batch.watermark_at(0).key_id == "beta" and batch.watermark_at(1) is None
    assert batch.watermark_at(2) is None and batch.watermark_at(3).spec == WatermarkSpec.parse(LEFT)
    # the live list: a token appended by the engine changes the next step's bias
    logits = torch.zeros(4, V)
    before = batch.apply(logits.clone())
    outs[2].append(outs[2][-1] ^ 1)  # index 3 now holds request 2 (lefthash h=1 reads the last token)
    after = batch.apply(logits.clone())
    assert torch.equal(before[0], after[0]) and not torch.equal(before[3], after[3])
    assert len(batch) == 2


def test_request_arguments_are_validated_with_the_field_named():
    assert WatermarkRequest.from_extra_args(None) == WatermarkRequest(WatermarkSpec.default(), None)
    # "off" is the watermark's one name for none, as over HTTP; False (and "none") keep working
    for off in ("off", "OFF", False, "none"):
        assert WatermarkRequest.from_extra_args({WATERMARK_ARG: off}) == WatermarkRequest(None, None), off
    with pytest.raises(ValueError, match=WATERMARK_ARG):
        WatermarkRequest.from_extra_args({WATERMARK_ARG: "kgw:gamma=2"})
    with pytest.raises(ValueError, match=WATERMARK_ARG):
        WatermarkRequest.from_extra_args({WATERMARK_ARG: 3})
    with pytest.raises(ValueError, match=KEY_ID_ARG):
        WatermarkRequest.from_extra_args({WATERMARK_ARG: "off", KEY_ID_ARG: "alpha"})
    with pytest.raises(ValueError, match=KEY_ID_ARG):
        WatermarkRequest.from_extra_args({WATERMARK_ARG: HF, KEY_ID_ARG: "alpha"})
    pasted = "Sup3rSecretMaterial/not-an-id"
    with pytest.raises(ValueError) as info:
        WatermarkRequest.from_extra_args({KEY_ID_ARG: pasted})
    assert pasted not in str(info.value)


def test_unknown_keys_raise_or_reach_the_error_hook_and_rotation_is_seen(keyring):
    requests = RequestWatermarks(V, keyring)
    with pytest.raises(KeyNotFoundError):
        requests.resolve(WatermarkRequest(WatermarkSpec.default(), "nosuchkey"))
    errors = []
    batch = WatermarkedBatch(requests, on_error=lambda index, exc: errors.append(index))
    batch.update([], [(3, {KEY_ID_ARG: "nosuchkey"}, [1], [])], [])
    assert errors == [3] and batch.watermark_at(3) is None
    assert requests.resolve(WatermarkRequest(WatermarkSpec.default(), None)).key_id == "alpha"
    keyring.rotate("beta")
    assert requests.resolve(WatermarkRequest(WatermarkSpec.default(), None)).key_id == "beta"
