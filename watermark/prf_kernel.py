"""An optional C batch of HMAC-SHA256 PRF calls (``csrc/prf_batch.c``, OpenSSL's libcrypto), through ctypes.

Per-context seeding makes one PRF call per scored position of a new text; in Python each costs about
1.3 us of hashlib copies and calls, in C about a tenth of that. The library is built once with the system C
compiler (``cc -O2 -shared -fPIC ... -lcrypto``, OpenSSL's headers needed) and cached as the engine's
kernels are (``$PROVMARK_KERNEL_DIR``, default ``~/.cache/provmark/kernels``, named by a hash of source,
flags and compiler; built to a temporary file, then renamed). Nothing depends on it: without a compiler or
headers, or with ``PROVMARK_NATIVE=0``, ``hmac_sha256_words`` returns None and ``watermark.prf`` computes
the same bytes with hashlib.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "prf_batch.c"
FLAGS = ("-O2", "-shared", "-fPIC", "-Wno-deprecated-declarations")  # SHA256_* are deprecated, not removed
LIBS = ("-lcrypto",)
DISABLE_ENV = "PROVMARK_NATIVE"  # the engine kernels' switch: one setting turns every native kernel off


def kernel_dir() -> Path:
    """Where built kernels are cached (``PROVMARK_KERNEL_DIR``, else the user's cache folder)."""
    override = os.environ.get("PROVMARK_KERNEL_DIR")
    if override:
        return Path(override).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "provmark" / "kernels"


def build() -> Path:
    """Compile the kernel unless this source/flags/compiler has a cached build; the library's path.
    Raises RuntimeError (with the compiler's message) when there is no compiler or the build fails."""
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler found")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(FLAGS + LIBS).encode(), version.encode()):
        digest.update(part + b"\0")
    target = kernel_dir() / f"prf_batch-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a library is loaded from here: ours only
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, *LIBS], capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building {SOURCE.name} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def _library():
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        function = ctypes.CDLL(str(build())).prf_hmac_sha256_words
    except (OSError, RuntimeError, AttributeError) as exc:
        log.info("batched PRF kernel unavailable, using hashlib: %s", exc)
        return None
    c_bytes, size = ctypes.c_char_p, ctypes.c_size_t
    function.argtypes = [c_bytes, c_bytes, c_bytes, size, c_bytes, size, size, ctypes.c_void_p]
    function.restype = ctypes.c_int
    return function


def available() -> bool:
    """True when the C kernel is built and loaded (``hmac_sha256_words`` will not return None)."""
    return _library() is not None


def hmac_sha256_words(inner_block: bytes, outer_block: bytes, prefix: bytes, messages: bytes,
                      width: int) -> bytes | None:
    """The first 8 bytes of HMAC-SHA256(key, prefix + m) for each ``width``-byte message m of ``messages``
    (``inner_block`` / ``outer_block``: the 64-byte key XOR ipad / opad), concatenated; None without the kernel."""
    function = _library()
    count = len(messages) // width if width else 0
    if function is None or count == 0 or count * width != len(messages):
        return None
    out = ctypes.create_string_buffer(8 * count)
    if function(inner_block, outer_block, prefix, len(prefix), messages, width, count, out) != 0:
        return None
    return out.raw
