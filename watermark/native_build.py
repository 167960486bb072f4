"""Building a C/C++ kernel once per source, flags and compiler, and caching the shared library.

Used by the engine's kernels (``generation/cpu/native.py``) and the batched PRF (``watermark/prf_kernel.py``).
Libraries live under ``$PROVMARK_KERNEL_DIR`` (default ``~/.cache/provmark/kernels``, only the user's), named
by a hash of what went into them; a build goes to a temporary file and is renamed into place, so processes
building at once never load half a library.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def kernel_dir() -> Path:
    """Where built kernels are cached (``PROVMARK_KERNEL_DIR``, else the user's cache folder)."""
    override = os.environ.get("PROVMARK_KERNEL_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(cache).expanduser() / "provmark" / "kernels"


def build_cached(compiler: str, source: Path, flags: Sequence[str], stem: str, libs: Sequence[str] = (),
                 salt: str = "", force: bool = False) -> Path:
    """The library built from ``source`` with ``compiler`` and ``flags`` (``libs`` after the source), from
    the cache unless ``force``; ``salt`` is anything else the build depends on (CPU flags). RuntimeError
    with the compiler's message when the build fails."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[0]
    digest = hashlib.sha256()
    for part in (source.read_bytes(), " ".join((*flags, *libs)).encode(), version.encode(), salt.encode()):
        digest.update(part)
        digest.update(b"\0")
    target = kernel_dir() / f"{stem}-{digest.hexdigest()[:16]}.so"
    if target.exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a library is loaded from here: ours only
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *flags, str(source), "-o", tmp, *libs], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building {source.name} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


DISABLE_ENV = "PROVMARK_NATIVE"  # one setting turns every native kernel off


def native_disabled() -> bool:
    """True when ``PROVMARK_NATIVE`` is 0 / false / no / off: every kernel's caller takes its Python path."""
    return os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off")


def load_c_library(source: Path, flags: Sequence[str], stem: str, libs: Sequence[str] = ()):
    """The ctypes library of the C ``source``, built with the system C compiler (``$CC``, else cc or gcc) and
    cached (``build_cached``); None when native kernels are disabled (``PROVMARK_NATIVE=0``). No compiler, a
    failed build or a failed load raise RuntimeError or OSError: the caller logs it and takes its Python path."""
    if native_disabled():
        return None
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found")
    return ctypes.CDLL(str(build_cached(compiler, source, flags, stem, libs=libs)))


def optional_c_library(source: Path, flags: Sequence[str], stem: str, fallback: str,
                       functions: dict[str, tuple[list, object]], libs: Sequence[str] = ()):
    """``load_c_library`` with ``functions`` (name: (argtypes, restype)) declared; None when native kernels are
    disabled, or when the build, the load or a function is missing (said once in the log, at INFO: the caller
    takes its ``fallback``)."""
    try:
        library = load_c_library(source, flags, stem, libs)
        if library is None:
            return None
        for name, (argtypes, restype) in functions.items():
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, restype
    except (OSError, RuntimeError, AttributeError) as exc:
        log.info("%s kernel unavailable, using %s: %s", stem, fallback, exc)
        return None
    return library


def address(array) -> int:
    """The address of a numpy array's first element, for a kernel called through ctypes: a ctypes view of its
    buffer (about 0.8 us) where ``array.ctypes.data`` builds a helper object each time (about 2.3 us, several
    times that right after a scoring pass has evicted the interpreter's caches). Arrays ctypes cannot view
    (read-only, non-contiguous or empty ones) take ``array.ctypes.data``: the same address."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data
