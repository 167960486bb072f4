"""The anchored kgw schemes' scoring pass in one C loop (``csrc/anchor_units.c``), through ctypes.

For minhash and selfhash, ``detector.scoring.score_positions`` computes per position the keyed min over the
context (the seed and its anchor), the green flag, the unit's key-free identity, its previous occurrence and
whether the common-unit table leaves it out: about ten numpy and torch passes over the text, 0.7 ms of a
1,000-token detection (half of it). One loop does the same in about a tenth of that, with the common-unit
table's cache misses prefetched. A two-part key scores each text twice (once per half), so it gains twice.

The Python path defines every number: ``anchor_scores`` returns None where the kernel does not apply (another
scheme, an hf spec, tables off the CPU, no compiler, ``PROVMARK_NATIVE=0``, an out-of-range token id) and the
caller computes the same arrays as before; ``tests/test_scoring_kernel.py`` compares the two. Built once with
the system C compiler and cached like the other native kernels (``watermark.native_build``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from watermark.native_build import build_cached
from watermark.prf import SEED_MULTIPLIER, green_threshold, vocab_mix_table

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "anchor_units.c"
FLAGS = ("-O2", "-shared", "-fPIC")
DISABLE_ENV = "PROVMARK_NATIVE"  # one setting turns every native kernel off
SCHEMES = ("minhash", "selfhash")
_MULTIPLIER = SEED_MULTIPLIER & ((1 << 64) - 1)


@functools.cache
def _library():
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    compiler = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found")
        function = ctypes.CDLL(str(build_cached(compiler, SOURCE, FLAGS, "anchor_units"))).anchor_units
    except (OSError, RuntimeError, AttributeError) as exc:
        log.info("scoring kernel unavailable, using numpy: %s", exc)
        return None
    p, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
    function.argtypes = [p, i64, ctypes.c_int, ctypes.c_int, i64, p, p, p, p, u64, i64,
                         p, u64, ctypes.c_int, ctypes.c_float, ctypes.c_int, p, p, p, p]
    function.restype = ctypes.c_int
    return function


def available() -> bool:
    """True when the C kernel is built and loaded."""
    return _library() is not None


def _constants(wm, tables) -> tuple:
    """The key's tables as the kernel reads them, their addresses computed once per key's tables (the
    tensors stay alive with ``tables``, which caches them per device)."""
    found = getattr(tables, "_anchor_kernel_args", None)
    if found is None:
        t = tables.tensors(torch.device("cpu"))
        selfhash = wm.spec.scheme == "selfhash"
        mix = vocab_mix_table(wm.vocab_size, "cpu")
        found = (t["token"].data_ptr(), t["salt"].data_ptr() if selfhash else None,
                 t["self"].data_ptr() if selfhash else None, mix.data_ptr(), (t, mix))
        tables._anchor_kernel_args = found
    return found


def anchor_scores(wm, token_ids, common, dedup: bool):
    """(flags bool [N], prev int64 [N], units int64 [N, 2], identities uint64 [N]) of ``token_ids`` under ``wm``
    exactly as ``detector.scoring.score_positions`` computes them (N = T - h; a position the common-unit table
    leaves out points at itself in prev), or None where the kernel does not apply."""
    spec = wm.spec
    function = _library()
    tables = getattr(wm, "_tables", None)
    if (function is None or spec.kind != "kgw" or spec.scheme not in SCHEMES or getattr(wm, "_hf", None) is not None
            or tables is None):
        return None
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    if ids.device.type != "cpu":
        return None
    ids = ids.contiguous()
    h = wm.context_width
    length = ids.shape[0]
    count = length - h
    if count <= 0:
        return None
    token_values, salt, own, vocab_mix, _ = _constants(wm, tables)
    slots = None
    slot_mask, probes, threshold = 0, 0, 0.0
    if common is not None:
        found = common.lookup_table(wm, length)
        if found is not None:
            table, probes, threshold = found
            slots, slot_mask = table.ctypes.data, table.shape[0] - 1
    # one buffer: units [N, 2], identities [N], prev [N], then the flags' N bytes
    out = np.empty(4 * count + (count + 7) // 8, dtype=np.int64)
    at = out.ctypes.data
    done = function(ids.data_ptr(), length, h, spec.scheme == "selfhash", wm.vocab_size,
                    token_values, salt, own, vocab_mix, _MULTIPLIER, green_threshold(spec.gamma),
                    slots, slot_mask, probes, threshold, dedup,
                    at + 32 * count, at, at + 16 * count, at + 24 * count)
    if done != 0:
        return None
    units = out[:2 * count].reshape(count, 2)
    identities = out[2 * count:3 * count].view(np.uint64)
    flags = out[4 * count:].view(np.bool_)[:count]
    return flags, out[3 * count:4 * count], units, identities
