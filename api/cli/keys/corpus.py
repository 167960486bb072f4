"""The texts of ``--corpus`` paths (``keys create``, ``rotate`` and ``calibrate``): the user's own human text."""

from __future__ import annotations

from pathlib import Path

from api.cli.detect import parse_record
from api.cli.errors import CLIError


def read_corpus(paths: list[str]) -> list[str]:
    """The texts of ``--corpus`` paths (``read_collections``), as one list."""
    return [text for found in read_collections(paths) for text in found]


def read_collections(paths: list[str]) -> list[list[str]]:
    """The texts of each ``--corpus`` path (one collection per path; paths without text are dropped): a directory
    gives each regular file under it that is UTF-8 text (hidden files and folders, and files that are not text,
    are skipped), a ``.jsonl`` file the ``text`` of each line, any other file its whole text. CLIError for a
    missing path, a bad JSONL line, a file that is not UTF-8 text, or no text at all."""
    collections: list[list[str]] = []
    for given in paths:
        texts: list[str] = []
        collections.append(texts)
        path = Path(given)
        if path.is_dir():
            for found in sorted(path.rglob("*")):
                parts = found.relative_to(path).parts
                if found.is_file() and not any(part.startswith(".") for part in parts):
                    text = _text_of(found)
                    if text is not None:
                        texts.append(text)
        elif path.is_file():
            if path.suffix == ".jsonl":
                texts.extend(_jsonl_texts(path))
            else:
                text = _text_of(path)
                if text is None:
                    raise CLIError(f"--corpus {given}: not UTF-8 text")
                texts.append(text)
        else:
            raise CLIError(f"--corpus {given}: no such file or directory")
    collections = [found for found in ([t for t in texts if t.strip()] for texts in collections) if found]
    if not collections:
        raise CLIError(f"--corpus {' '.join(paths)}: no text found")
    return collections


def _text_of(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CLIError(f"--corpus {path}: {exc.strerror or exc}") from None
    if b"\x00" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _jsonl_texts(path: Path) -> list[str]:
    """The ``text`` of each line, by the same record rule as ``provmark detect --jsonl``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"--corpus {path}: cannot read it as UTF-8 text ({exc.__class__.__name__})") from None
    return [parse_record(line, f"--corpus {path}", number)["text"]
            for number, line in enumerate(lines, 1) if line.strip()]
