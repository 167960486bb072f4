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
import logging
from pathlib import Path

from watermark.native_build import load_c_library

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "prf_batch.c"
FLAGS = ("-O2", "-shared", "-fPIC", "-Wno-deprecated-declarations")  # SHA256_* are deprecated, not removed
LIBS = ("-lcrypto",)


@functools.cache
def _library():
    try:
        library = load_c_library(SOURCE, FLAGS, "prf_batch", libs=LIBS)
        if library is None:
            return None
        function = library.prf_hmac_sha256_words
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
