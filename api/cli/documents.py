"""What a command is given to read: a file, standard input (``-``) or an http(s) URL, bounded in size."""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

from api.cli.errors import CLIError

FETCH_TIMEOUT_S = 10.0


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def is_file(source: str) -> bool:
    try:
        return Path(source).is_file()
    except (OSError, ValueError):  # text too long, or holding NUL, for a path
        return False


def read_document(source: str, limit: int, what: str) -> bytes:
    """The bytes of ``source`` (``-``: standard input; an http(s) URL: fetched; else a file). A CLIError naming
    ``what`` when it cannot be read, or holds more than ``limit`` bytes."""
    try:
        if source == "-":
            raw = sys.stdin.buffer.read(limit + 1)
        elif is_url(source):
            with urllib.request.urlopen(source, timeout=FETCH_TIMEOUT_S) as response:
                raw = response.read(limit + 1)
        else:
            with open(source, "rb") as handle:
                raw = handle.read(limit + 1)
    except urllib.error.URLError as error:
        raise CLIError(f"{what}: cannot fetch {source}: {error.reason}") from None
    except (OSError, ValueError) as error:
        raise CLIError(f"{what}: cannot read {source}: {getattr(error, 'strerror', None) or error}") from None
    if len(raw) > limit:
        raise CLIError(f"{what}: {source} holds more than {limit} bytes")
    return raw
