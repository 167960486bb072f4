"""Where provmark keeps its state on disk.

``PROVMARK_HOME`` (default ``~/.local/share/provmark``) holds the keyring, the database and the
converted model/tokenizer cache (``models/``). ``PROVMARK_MODELS_DIR`` moves only the cache, so
tests can give every test its own keyring while sharing one converted model.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = Path("~/.local/share/provmark")


def provmark_home() -> Path:
    """The state folder, created on first use with mode 0700."""
    home = Path(os.environ.get("PROVMARK_HOME") or DEFAULT_HOME).expanduser()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def models_dir() -> Path:
    """The folder for converted models and cached tokenizers."""
    override = os.environ.get("PROVMARK_MODELS_DIR")
    path = Path(override).expanduser() if override else provmark_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
