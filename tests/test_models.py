"""generation.models against the real embedded model (no mocks)."""

import shutil

import pytest
import torch

from generation.models import (
    WEIGHTS_FILE,
    LoadedModel,
    ModelAssetError,
    ensure_default_model,
    load_gguf_model,
    load_model,
    resolve_device,
    resolve_dtype,
)
from watermark.vocab import INSTALL_HINT, default_gguf_path, encode, load_vocabulary

pytestmark = pytest.mark.slow

SMOLLM2_VOCAB_SIZE = 49152  # SmolLM2 config.json vocab_size
SMOLLM2_PARAMETERS = 134_515_008  # 30 layers x 576 hidden, tied embeddings (~134.5M)
PROBE_TEXT = "The quick brown fox jumps over the lazy dog. 🎉 def f(x): return x**2"


@pytest.fixture(scope="session")
def converted_folder():
    return ensure_default_model()


@pytest.fixture(scope="session")
def default_model(converted_folder) -> LoadedModel:
    return load_model()


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids], device=model.device)).logits[0].float().cpu()


def test_converted_folder_holds_weights_config_and_tokenizer(converted_folder):
    for name in ("config.json", "generation_config.json", WEIGHTS_FILE, "tokenizer.json"):
        assert (converted_folder / name).is_file(), name
    assert "quantization_config" not in (converted_folder / "config.json").read_text()


def test_second_ensure_does_not_reconvert(converted_folder):
    weights = converted_folder / WEIGHTS_FILE
    before = weights.stat().st_mtime_ns
    assert ensure_default_model() == converted_folder
    assert weights.stat().st_mtime_ns == before


def test_default_model_shape_and_options(default_model):
    network = default_model.model
    assert not network.training
    assert default_model.model_id == "SmolLM2-135M-Instruct"
    assert default_model.device == torch.device("cpu") or torch.cuda.is_available()
    assert network.config.vocab_size == SMOLLM2_VOCAB_SIZE == default_model.vocab.vocab_size
    assert sum(p.numel() for p in network.parameters()) == SMOLLM2_PARAMETERS
    assert network.config._attn_implementation == "sdpa"
    assert next(network.parameters()).dtype == default_model.dtype
    assert default_model.vocab is load_vocabulary()


def test_logits_width_is_vocab_size(default_model):
    logits = _logits(default_model.model, encode(default_model.vocab, PROBE_TEXT))
    assert logits.shape[-1] == SMOLLM2_VOCAB_SIZE
    assert torch.isfinite(logits).all()


def test_converted_logits_equal_gguf_logits(default_model):
    if default_model.dtype != torch.float32 or default_model.device.type != "cpu":
        pytest.skip("exact comparison is defined for the float32 CPU load")
    gguf_model = load_gguf_model(default_gguf_path()).eval()
    ids = encode(default_model.vocab, PROBE_TEXT)
    torch.testing.assert_close(_logits(default_model.model, ids), _logits(gguf_model, ids), rtol=1e-5, atol=1e-5)


def test_bf16_load_on_cpu(default_model):
    loaded = load_model(device="cpu", dtype="bf16")
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    ids = encode(loaded.vocab, PROBE_TEXT)
    reduced, full = _logits(loaded.model, ids), _logits(default_model.model, ids)
    # bf16 keeps 8 mantissa bits: the distributions differ a little, the favourite tokens mostly agree.
    agreement = (reduced.argmax(-1) == full.argmax(-1)).float().mean().item()
    assert agreement >= 0.75


def test_local_folder_loads_like_the_default(converted_folder, default_model):
    local = load_model(converted_folder, device="cpu", dtype=torch.float32)
    assert local.model_id == "smollm2-135m-instruct"
    assert local.vocab.fingerprint == default_model.vocab.fingerprint
    ids = encode(local.vocab, PROBE_TEXT)
    assert torch.equal(_logits(local.model, ids), _logits(default_model.model, ids))


def test_missing_folder_error_names_it_and_says_how_to_install(tmp_path):
    with pytest.raises(ModelAssetError, match="no-such-model") as caught:
        load_model(tmp_path / "no-such-model")
    assert isinstance(caught.value, FileNotFoundError)
    assert INSTALL_HINT in str(caught.value)


def test_folder_without_weights_is_rejected(converted_folder, tmp_path):
    folder = tmp_path / "no-weights"
    shutil.copytree(converted_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    with pytest.raises(ModelAssetError, match="no weights"):
        load_model(folder)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("float32", torch.float32),
        ("fp32", torch.float32),
        ("BF16", torch.bfloat16),
        ("bfloat16", torch.bfloat16),
        ("fp16", torch.float16),
        ("torch.float16", torch.float16),
        (torch.float16, torch.float16),
    ],
)
def test_dtype_names(name, expected):
    assert resolve_dtype(name, torch.device("cpu")) == expected


def test_dtype_defaults_to_float32_on_cpu():
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


@pytest.mark.parametrize("bad", ["int8", "float8", "", torch.int64])
def test_unknown_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype(bad, torch.device("cpu"))


def test_device_choice():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device("not-a-device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_request_without_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_model(device="cuda")
