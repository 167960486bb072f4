"""``--model`` takes a local GGUF file, as llama.cpp and Ollama users keep their models: converted once into its
own cache folder (as the embedded default is), the same logits as the default when it is the default's file, and
a clear ModelAssetError for a file transformers cannot read (a missing file, a damaged one, an architecture it does
not dequantise), from the library and the CLI alike."""

import shutil

import gguf
import numpy as np
import pytest
import torch

from api.cli.main import main
from generation.models import ModelAssetError, ensure_gguf_model, load_model
from watermark.vocab import default_gguf_path, encode, gguf_cache_dir, load_vocabulary

pytestmark = pytest.mark.slow
PROBE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def own_copy(tmp_path_factory):
    """The default's GGUF as a user's own file (another path: its own cache folder), converted in a fresh models
    folder so that the conversion is the test's."""
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "my-model.Q4_1.gguf"
    shutil.copyfile(default_gguf_path(), path)
    return path


@pytest.fixture()
def models_dir(tmp_path_factory, monkeypatch):
    target = tmp_path_factory.getbasetemp() / "gguf-models"
    monkeypatch.setenv("PROVMARK_MODELS_DIR", str(target))
    return target


def test_a_gguf_file_loads_with_the_defaults_logits_and_is_converted_once(own_copy, models_dir, capsys):
    loaded = load_model(str(own_copy))
    assert "converting my-model.Q4_1.gguf" in capsys.readouterr().err
    folder = gguf_cache_dir(own_copy.resolve())
    assert folder.parent == models_dir and (folder / "model.safetensors").is_file()
    default = load_model()
    assert loaded.vocab.fingerprint == default.vocab.fingerprint and loaded.model_id == "my-model.Q4_1"
    ids = torch.tensor([encode(default.vocab, PROBE)])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, default.model(ids).logits)
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert ensure_gguf_model(own_copy.resolve()) == folder and weights.stat().st_mtime_ns == before
    assert load_vocabulary(own_copy).fingerprint == default.vocab.fingerprint  # the detector's side: no weights
    capsys.readouterr()
    load_model(str(own_copy))
    assert "converting" not in capsys.readouterr().err


def test_a_missing_or_damaged_gguf_is_a_clear_error(tmp_path, models_dir):
    with pytest.raises(ModelAssetError, match="does not exist"):
        load_model(str(tmp_path / "absent.gguf"))
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    with pytest.raises(ModelAssetError, match="'damaged.gguf': cannot read its tokenizer"):
        load_model(str(damaged))
    assert not any(models_dir.glob("gguf-*-damaged/model.safetensors"))  # nothing half-made is trusted


def test_an_architecture_transformers_cannot_dequantise_is_refused(tmp_path, models_dir):
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "provmark-unknown-arch")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelAssetError, match="'other.gguf': cannot read its"):
        load_model(str(path))


def test_the_cli_says_what_is_wrong_with_a_gguf(tmp_path, models_dir, capsys):
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"not a gguf at all")
    code = main(["generate", "hi", "--model", str(damaged), "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code != 0 and "damaged.gguf" in err and "Traceback" not in err
