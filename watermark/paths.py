"""Where provmark keeps its state on disk.

``PROVMARK_HOME`` (default ``~/.local/share/provmark``) holds the keyring, the database and the
converted model/tokenizer cache (``models/``); ``write_private_atomic`` replaces a 0600 file in one step.
``PROVMARK_MODELS_DIR`` moves only the cache, so tests can give every test its own keyring while sharing one converted model.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEFAULT_HOME = Path("~/.local/share/provmark")
PRIVATE_MODE = 0o600  # every secret-bearing file: owner read/write only


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


def write_private_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a 0600 temp file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), PRIVATE_MODE)  # in case a strange umask removed owner bits
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

