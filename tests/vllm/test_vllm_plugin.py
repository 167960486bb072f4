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
# vLLM on a 2-core CPU (docs in FACTS.md): a bounded KV cache, no core held back for the front end
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
