"""The vLLM plugin's sampling watermarks without vLLM (generation/vllm/sampling_rows.py): step by step, the
token the plugin leaves finite is the token our engine's LogitsPipeline chooses for the same logits,
parameters and history; what cannot be reproduced exactly is refused at admission."""

from types import SimpleNamespace

import pytest
import torch

from generation.sample.params import SamplerState, SamplingParams
from generation.sample.pipeline import LogitsPipeline, StepRows
from generation.vllm.rows import KEY_ID_ARG, WATERMARK_ARG, RequestWatermarks, WatermarkedBatch
from generation.vllm.sampling_rows import LiveHistory, check_sampling_request, our_params
from watermark.scheme import generation_watermark

V = 49152
GUMBEL = "gumbel:h=4"
SYNTHID = "synthid:h=4"
HF_SYNTHID = "hf:synthid,keys=654:400:836:123:340:443:597:160:57:590,ngram_len=3,context_history_size=16"
SAMPLED = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}


def _vllm_params(**fields):
    """The attributes the plugin reads of vLLM's SamplingParams (vLLM's defaults otherwise)."""
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": None, "repetition_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0}
    return SimpleNamespace(**{**base, **fields})


@pytest.fixture
def sampling_keys(keyring):
    """Keys bound to the sampling specs (a sampling key is scored only under its own spec)."""
    return {spec: keyring.create(f"k-{spec.split(':')[0]}", spec=spec).key_id for spec in (GUMBEL, SYNTHID)}


def test_live_history_reads_as_prompt_plus_output():
    prompt, output = list(range(100, 110)), [1, 2, 3]
    history = LiveHistory(prompt[-4:], len(prompt), output)
    whole = prompt + output
    assert len(history) == len(whole)
    for key in (slice(9, 13), slice(6, 10), slice(-4, None), slice(11, 13), slice(13, 13), slice(6, 13, 2), -1, 7):
        assert history[key] == whole[key]
    output.append(4)  # the engine appends to its live list
    assert history[-5:] == (prompt + output)[-5:]
    with pytest.raises(IndexError):
        history[5:8]  # older than the kept tail


@pytest.mark.parametrize("steps", [40])
def test_forced_tokens_equal_our_engines_choices_step_by_step(keyring, sampling_keys, steps):
    """A mixed batch (gumbel, synthid, hf:synthid, the default kgw, unwatermarked), each row with its own
    sampling settings and seed: each step the plugin leaves exactly our engine's token finite; kgw and
    unwatermarked rows are left to vLLM's draw (biased, untouched)."""
    extras = [{WATERMARK_ARG: GUMBEL, KEY_ID_ARG: sampling_keys[GUMBEL]},
              {WATERMARK_ARG: SYNTHID, KEY_ID_ARG: sampling_keys[SYNTHID]},
              {WATERMARK_ARG: HF_SYNTHID}, None, {WATERMARK_ARG: "off"},
              {WATERMARK_ARG: GUMBEL + ",dedup=false", KEY_ID_ARG: sampling_keys[GUMBEL]}]
    settings = [SAMPLED, {"temperature": 1.0}, {"temperature": 0.7, "min_p": 0.05}, SAMPLED, SAMPLED,
                {"temperature": 1.3, "top_p": 0.9}]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (9, 5, 2, 7, 3, 12)]
    outputs: list[list[int]] = [[] for _ in extras]
    vllm_params = [_vllm_params(seed=50 + i, **s) for i, s in enumerate(settings)]
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    added = [(i, extras[i], prompts[i], outputs[i], our_params(vllm_params[i])) for i in range(len(extras))]
    batch.update([], added, [])
    sampled_rows = [0, 1, 2, 5]
    marks = [batch.watermark_at(i) for i in sampled_rows]
    # our engine's rows, built from the same settings directly (not through the plugin's conversion)
    states = [SamplerState(SamplingParams(seed=50 + i, **settings[i]), prompts[i], set()) for i in sampled_rows]
    pipeline = LogitsPipeline(V, "cpu")
    for step in range(steps):
        logits = torch.randn(len(extras), V, generator=gen) * 3
        logits[:, step % 7] += 9  # a favourite token: contexts repeat, so dedup has work to do
        forced = batch.apply(logits.clone())
        want = pipeline.sample(logits[sampled_rows], StepRows.of(states, marks)).token_ids
        finite = torch.isfinite(forced[sampled_rows])
        assert finite.sum(1).tolist() == [1] * len(sampled_rows)
        assert torch.equal(finite.int().argmax(1), want)
        assert not torch.equal(forced[3], logits[3]) and torch.equal(forced[4], logits[4])  # kgw biased; off untouched
        for j, i in enumerate(sampled_rows):
            states[j].append(int(want[j]))
            outputs[i].append(int(want[j]))
        for i in (3, 4):
            outputs[i].append(int(forced[i].argmax()))


def test_padded_columns_of_a_sampling_row_are_forced_too(keyring, sampling_keys):
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    extra = {WATERMARK_ARG: GUMBEL, KEY_ID_ARG: sampling_keys[GUMBEL]}
    batch.update([], [(0, extra, [1, 2, 3, 4, 5], [], our_params(_vllm_params(**SAMPLED)))], [])
    forced = batch.apply(torch.randn(1, V + 64, generator=torch.Generator().manual_seed(2)))
    assert int(torch.isfinite(forced).sum()) == 1 and int(forced[0].argmax()) < V


def test_what_the_plugin_cannot_reproduce_is_refused(keyring, sampling_keys):
    gumbel_key = next(k for k in keyring.list() if k.key_id == sampling_keys[GUMBEL])
    kgw_key = keyring.active()
    for spec in (GUMBEL, SYNTHID, HF_SYNTHID):
        parsed = generation_watermark(spec, V, key_id=sampling_keys.get(spec), keyring=keyring).spec
        with pytest.raises(ValueError, match="greedy"):
            check_sampling_request(parsed, _vllm_params(temperature=0.0))
        for field, value in (("repetition_penalty", 1.2), ("presence_penalty", 0.5), ("frequency_penalty", -0.3)):
            with pytest.raises(ValueError, match=field):
                check_sampling_request(parsed, _vllm_params(**{field: value}))
    gumbel = generation_watermark(GUMBEL, V, key_id=sampling_keys[GUMBEL], keyring=keyring).spec
    check_sampling_request(gumbel, _vllm_params(**SAMPLED), gumbel_key)  # accepted
    with pytest.raises(ValueError, match="bound to"):
        check_sampling_request(gumbel, _vllm_params(**SAMPLED), kgw_key)
    vllm_gumbel = generation_watermark("vllm:gumbel,context_width=4", V, key_id=kgw_key.key_id, keyring=keyring).spec
    with pytest.raises(ValueError, match="does not generate"):
        check_sampling_request(vllm_gumbel, _vllm_params(**SAMPLED))
    kgw = generation_watermark(None, V, keyring=keyring).spec
    check_sampling_request(kgw, _vllm_params(temperature=0.0, repetition_penalty=1.3))  # a bias spec: anything goes


def test_a_sampling_row_without_its_parameters_is_left_unwatermarked_and_reported(keyring, sampling_keys):
    errors = []
    batch = WatermarkedBatch(RequestWatermarks(V, keyring), on_error=lambda index, exc: errors.append((index, exc)))
    extra = {WATERMARK_ARG: GUMBEL, KEY_ID_ARG: sampling_keys[GUMBEL]}
    batch.update([], [(0, extra, [1, 2, 3, 4], []), (1, extra, [1, 2, 3, 4], [], SamplingParams(temperature=0.0))], [])
    assert [index for index, _ in errors] == [0, 1] and "greedy" in str(errors[1][1])
    assert len(batch) == 0


def test_a_batch_of_sampling_rows_only_is_forced_in_place_to_our_engines_choices(keyring, sampling_keys):
    """Every row sampled (the plugin's no-copy path): the same tokens as our engine, step by step."""
    specs = [GUMBEL, SYNTHID, GUMBEL]
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (6, 8, 5)]
    outputs: list[list[int]] = [[] for _ in specs]
    batch = WatermarkedBatch(RequestWatermarks(V, keyring))
    added = [(i, {WATERMARK_ARG: spec, KEY_ID_ARG: sampling_keys[spec]}, prompts[i], outputs[i],
              our_params(_vllm_params(seed=70 + i, **SAMPLED))) for i, spec in enumerate(specs)]
    batch.update([], added, [])
    marks = [batch.watermark_at(i) for i in range(len(specs))]
    states = [SamplerState(SamplingParams(seed=70 + i, **SAMPLED), prompts[i], set()) for i in range(len(specs))]
    pipeline = LogitsPipeline(V, "cpu")
    for _ in range(12):
        logits = torch.randn(len(specs), V, generator=gen) * 3
        want = pipeline.sample(logits, StepRows.of(states, marks)).token_ids
        forced = batch.apply(logits.clone())
        assert torch.isfinite(forced).sum(1).tolist() == [1] * len(specs)
        assert torch.equal(forced.argmax(1), want)
        for state, out, token in zip(states, outputs, want.tolist()):
            state.append(token)
            out.append(token)
