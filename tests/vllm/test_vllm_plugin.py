"""The vLLM plugin inside a real vLLM engine (CPU build). Runs only in .venv-vllm:

    bash scripts/setup_vllm_venv.sh && .venv-vllm/bin/python -m pytest -q tests/vllm

The main suite does not collect this folder (vLLM is not installed in .venv)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from generation.vllm.plugin import PLUGIN_FQCN, ProvmarkWatermarkLogitsProcessor
from generation.vllm.rows import KEY_ID_ARG, WATERMARK_ARG
from watermark.keys import Keyring
from watermark.processor import WatermarkProcessor
from watermark.scheme import generation_watermark

V = 49152
KEY_ID = "vllm-test"
NEW_TOKENS = 200
Z_MIN = 4.0  # one-sided p ~ 3.2e-5: the detector's own default threshold
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# vLLM on a 2-core CPU: a bounded KV cache (GiB), no core held back for the front end (vLLM's CPU installation guide)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def engine_home(tmp_path_factory):
    """A keyring with one active key, in the environment vLLM's workers inherit."""
    home = tmp_path_factory.mktemp("vllm-provmark-home")
    Keyring(home).create(KEY_ID)  # writes master.key: workers open the keyring through PROVMARK_HOME
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROVMARK_HOME", str(home))
        for name, value in VLLM_ENV.items():
            patch.setenv(name, os.environ.get(name, value))
        yield home


@pytest.fixture(scope="module")
def llm(engine_home):
    from vllm import LLM

    from generation.models import ensure_default_model

    # eager: skips a compile warm-up of minutes on 2 cores; logits processors run the same either way
    engine = LLM(str(ensure_default_model()), logits_processors=[PLUGIN_FQCN], dtype="float32",
                 max_model_len=1024, seed=0, enforce_eager=True)
    yield engine
    del engine


@pytest.fixture(scope="module")
def texts(llm, engine_home):
    """One batch, one row per case: the default (watermarked) request and an opted-out one."""
    with pytest.MonkeyPatch.context() as patch:  # admission opens the keyring in this process
        patch.setenv("PROVMARK_HOME", str(engine_home))
        cases = {"default": None, "off": {WATERMARK_ARG: "off"}}
        params = [SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, seed=seed,
                                 extra_args=extra) for seed, extra in enumerate(cases.values(), start=11)]
        outputs = llm.generate([PROMPT] * len(cases), params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [NEW_TOKENS] * len(cases)
    return {name: o.outputs[0].text for name, o in zip(cases, outputs)}


@pytest.fixture
def home_keyring(engine_home, monkeypatch):
    monkeypatch.setenv("PROVMARK_HOME", str(engine_home))  # undo conftest's per-test home
    return Keyring(engine_home)


def _detect_cli(text, home):
    """`provmark detect --json` on the text, as a user would run it."""
    cli = Path(sys.executable).with_name("provmark")
    done = subprocess.run([str(cli), "detect", "--json", "-"], check=False, input=text, capture_output=True,
                          text=True, env={**os.environ, "PROVMARK_HOME": str(home)}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow
def test_watermarked_generation_is_detected_by_provmark_detect(texts, engine_home):
    verdict = _detect_cli(texts["default"], engine_home)  # the default: default spec, active key
    assert verdict["z_score"] >= Z_MIN and verdict["verdict"] == "watermarked"
    assert verdict["key_id"] == KEY_ID


@pytest.mark.slow
def test_opted_out_generation_is_not_detected(texts, engine_home):
    verdict = _detect_cli(texts["off"], engine_home)
    assert verdict["z_score"] < Z_MIN and verdict["verdict"] != "watermarked"


@pytest.mark.slow
def test_a_request_naming_an_unknown_key_is_rejected_at_admission(llm, home_keyring):
    with pytest.raises(VLLMValidationError, match=KEY_ID_ARG):
        llm.generate([PROMPT], SamplingParams(max_tokens=4, extra_args={KEY_ID_ARG: "nosuchkey"}),
                     use_tqdm=False)


def test_the_plugin_biases_a_crafted_batch_exactly_as_our_processor(home_keyring):
    """Through vLLM's own BatchUpdate types: adds, a swap, a move and live output lists."""
    standby = home_keyring.create("standby").key_id
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: V))
    plugin = ProvmarkWatermarkLogitsProcessor(config, torch.device("cpu"), False)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (12, 3, 7, 9)]
    outputs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (4, 0, 2, 1)]
    extra = [None, {WATERMARK_ARG: "kgw:scheme=lefthash,h=1,gamma=0.5,delta=3.0"},
             {KEY_ID_ARG: standby}, {WATERMARK_ARG: "off"}]
    added = [(i, SamplingParams(extra_args=extra[i]), prompts[i], outputs[i]) for i in range(4)]
    plugin.update_state(BatchUpdate(batch_size=4, removed=[], added=added, moved=[]))
    plugin.update_state(BatchUpdate(batch_size=4, removed=[], added=[], moved=[
        (0, 3, MoveDirectionality.SWAP), (2, 1, MoveDirectionality.UNIDIRECTIONAL)]))
    for out in outputs:
        out.append(7)  # the engine appends to the lists it handed over
    logits = torch.randn(3, V, generator=gen)  # the batch shrank to 3 rows after the move
    # rows now: 0 <- request 3 (off), 1 <- request 2 (standby), 2 empty, 3 <- request 0 (past the batch)
    marks = [None, generation_watermark(None, V, key_id=standby, keyring=home_keyring), None]
    expected = logits.clone()
    WatermarkProcessor().apply(expected, [(), prompts[2] + outputs[2], ()], marks)
    assert torch.equal(plugin.apply(logits.clone()), expected)
    assert not torch.equal(expected, logits) and not plugin.is_argmax_invariant()


@pytest.mark.slow
def test_the_evaluation_generates_through_vllm_with_our_keys(llm, home_keyring):
    """evaluation.vllm_generator (``provmark eval robustness --generate-backend vllm``): rows carry their
    watermark to the plugin; the watermarked row detects, the unwatermarked one does not."""
    from detector.service import Detector
    from evaluation.vllm_generator import VLLMGenerator
    from generation.sample.sampler import SamplingParams as OurParams

    tokenizer = llm.get_tokenizer()
    prompt = tokenizer(PROMPT)["input_ids"]
    params = [OurParams(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, temperature=1.0, seed=s) for s in (3, 4)]
    marks = [generation_watermark(None, V, key_id=KEY_ID, keyring=home_keyring), None]
    outs = VLLMGenerator(home_keyring, llm=llm).generate([prompt, prompt], params, watermarks=marks)
    assert [len(o.token_ids) for o in outs] == [NEW_TOKENS, NEW_TOKENS]
    detector = Detector(keyring=home_keyring)
    marked, plain = (detector.detect(o.text, keys=[KEY_ID]) for o in outs)
    assert marked.z_score >= Z_MIN and marked.verdict == "watermarked"
    assert plain.z_score < Z_MIN and plain.verdict != "watermarked"


def test_the_plugin_biases_with_the_engines_native_kernels(home_keyring, monkeypatch):
    """The cost fix: the worker's plugin routes the bias (and the Gumbel race's pruning) to the engine's C++
    kernels, as generation/engine.py does, instead of torch.compile's per-call path."""
    from generation.cpu import native
    from watermark import greenlist, gumbel

    if not native.available(torch.float32, torch.device("cpu")):
        pytest.skip("no C++ compiler: the tensor code stays (same integers)")
    monkeypatch.setattr(greenlist, "_bias_backend", None)
    monkeypatch.setattr(gumbel, "_survivors_backend", None)
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: V))
    ProvmarkWatermarkLogitsProcessor(config, torch.device("cpu"), False)
    assert greenlist._bias_backend is native.watermark_bias
    assert gumbel._survivors_backend is native.gumbel_survivors


# ---- sampling watermarks (gumbel:, synthid:): the plugin chooses the token as our engine's stage 8 does
GUMBEL, SYNTHID = "gumbel:h=4", "synthid:h=4"
DETECTED_P = 1e-5  # the brief's bar for ~200 tokens


@pytest.fixture(scope="module")
def sampling_keys(engine_home):
    """One key bound to each sampling spec (a sampling key is scored only under its own spec)."""
    ring = Keyring(engine_home)
    return {spec: ring.create(f"vllm-{spec.split(':')[0]}", spec=spec).key_id for spec in (GUMBEL, SYNTHID)}


@pytest.fixture(scope="module")
def sampling_texts(llm, engine_home, sampling_keys):
    """One batch: a gumbel row, a synthid row, and an opted-out row with the same settings."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PROVMARK_HOME", str(engine_home))
        cases = {GUMBEL: {WATERMARK_ARG: GUMBEL, KEY_ID_ARG: sampling_keys[GUMBEL]},
                 SYNTHID: {WATERMARK_ARG: SYNTHID, KEY_ID_ARG: sampling_keys[SYNTHID]},
                 "off": {WATERMARK_ARG: "off"}}
        params = [SamplingParams(temperature=1.0, top_k=100, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, seed=seed,
                                 extra_args=extra) for seed, extra in enumerate(cases.values(), start=21)]
        outputs = llm.generate([PROMPT] * len(cases), params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [NEW_TOKENS] * len(cases)
    return {name: o.outputs[0].text for name, o in zip(cases, outputs)}


@pytest.mark.slow
@pytest.mark.parametrize("spec", [GUMBEL, SYNTHID])
def test_sampling_watermarked_generation_is_detected_and_the_unwatermarked_is_not(spec, sampling_texts,
                                                                                   sampling_keys, home_keyring):
    from detector.service import Detector

    detector = Detector(keyring=home_keyring)
    marked = detector.detect(sampling_texts[spec], spec=spec, keys=[sampling_keys[spec]])
    assert marked.p_value < DETECTED_P and marked.verdict == "watermarked"
    plain = detector.detect(sampling_texts["off"], spec=spec, keys=[sampling_keys[spec]])
    assert plain.p_value > DETECTED_P and plain.verdict != "watermarked"


@pytest.mark.slow
@pytest.mark.parametrize("settings, message", [
    ({"temperature": 0.0}, "greedy"),
    ({"temperature": 1.0, "repetition_penalty": 1.2}, "repetition_penalty"),
    ({"temperature": 1.0, "presence_penalty": 0.5}, "presence_penalty"),
])
def test_sampling_requests_the_plugin_cannot_reproduce_are_refused_at_admission(settings, message, llm, sampling_keys,
                                                                                 home_keyring):
    extra = {WATERMARK_ARG: GUMBEL, KEY_ID_ARG: sampling_keys[GUMBEL]}
    with pytest.raises(VLLMValidationError, match=message):
        llm.generate([PROMPT], SamplingParams(max_tokens=4, extra_args=extra, **settings), use_tqdm=False)


@pytest.mark.slow
def test_a_sampling_spec_on_a_key_bound_to_another_spec_is_refused(llm, sampling_keys, home_keyring):
    extra = {WATERMARK_ARG: SYNTHID, KEY_ID_ARG: sampling_keys[GUMBEL]}
    with pytest.raises(VLLMValidationError, match="bound to"):
        llm.generate([PROMPT], SamplingParams(temperature=1.0, max_tokens=4, extra_args=extra), use_tqdm=False)


@pytest.mark.slow
def test_a_kgw_spec_with_other_colours_than_its_key_is_refused(llm, home_keyring):
    """As in our generation service: text under the default key's colours, or none (spec switching)."""
    extra = {WATERMARK_ARG: "kgw:scheme=selfhash,h=1,gamma=0.25,delta=2", KEY_ID_ARG: KEY_ID}
    with pytest.raises(VLLMValidationError, match="bound to"):
        llm.generate([PROMPT], SamplingParams(max_tokens=4, extra_args=extra), use_tqdm=False)
