"""The keyed kgw schemes' scoring pass in one C loop (``csrc/kgw_units.c``), through ctypes.

``detector.scoring.score_positions`` computes per position the seed (for minhash and selfhash the keyed min
over the context, which also names the anchor), the green flag, the unit's key-free identity, its previous
occurrence and whether the common-unit table leaves it out: about ten numpy and torch passes over the text,
0.7 ms of a 1,000-token detection (half of it). One loop does the same in about a tenth of that, with the
common-unit table's cache misses prefetched. A two-part key scores each text twice (once per half), so it
gains twice. unigram and lefthash take their seeds from ``watermark.seeding.context_seeds`` (lefthash over
h > 1 tokens: the joint-context PRF) and the rest from the kernel.

The Python path defines every number: ``kgw_scores`` returns None where the kernel does not apply (another
scheme, an hf spec, tables off the CPU, no compiler, ``PROVMARK_NATIVE=0``, an out-of-range token id) and the
caller computes the same arrays as before; ``tests/test_scoring_kernel.py`` compares the two. Built once with
the system C compiler and cached like the other native kernels (``watermark.native_build``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import weakref
from pathlib import Path

import numpy as np
import torch

from watermark.native_build import address, load_c_library
from watermark.prf import SEED_MULTIPLIER, green_threshold, vocab_mix_table
from watermark.schemes import family_of
from watermark.seeding import context_seeds

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "kgw_units.c"
FLAGS = ("-O2", "-shared", "-fPIC")
ANCHORED = ("minhash", "selfhash")
SEEDED = ("unigram", "lefthash")
_MULTIPLIER = SEED_MULTIPLIER & ((1 << 64) - 1)


@functools.cache
def _library():
    try:
        library = load_c_library(SOURCE, FLAGS, "kgw_units")
        if library is None:
            return None
        anchored, seeded, frequencies = library.anchor_units, library.seeded_units, library.common_frequencies
    except (OSError, RuntimeError, AttributeError) as exc:
        log.info("scoring kernel unavailable, using numpy: %s", exc)
        return None
    p, i64, u64, c_int, c_float = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_float
    anchored.argtypes = [p, i64, c_int, c_int, i64, p, p, p, p, u64, i64, p, u64, c_int, c_float, c_int, p, p, p, p, p]
    seeded.argtypes = [p, i64, c_int, p, i64, c_int, i64, p, u64, i64, p, u64, c_int, c_float, c_int, p, p, p, p]
    anchored.restype = seeded.restype = ctypes.c_int
    frequencies.argtypes = [p, i64, p, u64, c_int, p]
    frequencies.restype = None
    return anchored, seeded, frequencies


def available() -> bool:
    """True when the C kernel is built and loaded."""
    return _library() is not None


_constants_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per key's SeedTables, while it lives


def _constants(wm, tables) -> tuple:
    """The key's tables as the kernel reads them, their addresses computed once per key's tables (the
    tensors stay alive with ``tables``, which caches them per device): (token values, salt, own, vocab mix,
    unigram seed, the tensors)."""
    found = _constants_of.get(tables)
    if found is None:
        t = tables.tensors(torch.device("cpu"))
        mix = vocab_mix_table(wm.vocab_size, "cpu")

        def address(name):
            return t[name].data_ptr() if name in t else None

        found = (address("token"), address("salt"), address("self"), mix.data_ptr(),
                 int(t["unigram"].reshape(-1)[0]) if "unigram" in t else 0, (t, mix))
        _constants_of[tables] = found
    return found


def common_frequencies(identities: np.ndarray, slots: np.ndarray, probes: int) -> np.ndarray | None:
    """float32 [N]: each uint64 identity's frequency in the packed common-unit table ``slots``
    (``detector.unit_lookup.packed_hash_table``; 0 where absent), or None without the kernel."""
    functions = _library()
    if functions is None:
        return None
    ids = np.ascontiguousarray(identities, dtype=np.uint64)
    out = np.empty(ids.shape[0], dtype=np.uint32)
    functions[2](address(ids), ids.shape[0], address(slots), slots.shape[0] - 1, probes, address(out))
    return out.view(np.float32)


def _lefthash_seeds(tables, ids: torch.Tensor, h: int, count: int) -> torch.Tensor:
    """Each position's lefthash seed, as ``watermark.seeding.context_seeds`` computes it: h = 1 the key's table
    entry of the context token; h > 1 the joint-context PRF, every context in one batch call of the C PRF
    kernel (``KeyedPRF.packed_seed_words``: the same bytes as one ``seed`` call per context), else per context."""
    contexts = ids.unfold(0, h + 1, 1)[:, :h]
    if h > 1:
        words = tables.prf.packed_seed_words(contexts.numpy().astype("<u4").tobytes(), 4 * h)
        if words is not None:
            return torch.from_numpy(np.frombuffer(words, dtype="<i8", count=count).astype(np.int64))
    return context_seeds(tables, contexts, None).reshape(-1).contiguous()


def kgw_scores(wm, token_ids, common, dedup: bool, match=None):
    """(flags bool [N], prev int64 [N], units int64 [N, k], identities uint64 [N]) of ``token_ids`` under ``wm``
    exactly as ``detector.scoring.score_positions`` computes them (N = T - h; a position the common-unit table
    leaves out points at itself in prev; units (seed, token) for minhash and selfhash, the (h + 1)-gram for
    unigram and lefthash), or None where the kernel does not apply.

    ``match``: a ``db.output_grams.MatchRequest`` the same C call runs over the token ids (the own-output match
    of every verdict, without a crossing of its own); it reads as not run where this returns None before C."""
    spec = wm.spec
    functions = _library()
    tables = getattr(wm, "_tables", None)
    family = family_of(spec)
    if (functions is None or not (family.green_list and family.needs_key) or spec.scheme not in ANCHORED + SEEDED
            or getattr(wm, "_hf", None) is not None or tables is None):
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
    token_values, salt, own, vocab_mix, unigram_seed, _ = _constants(wm, tables)
    slots = None
    slot_mask, probes, threshold = 0, 0, 0.0
    if common is not None:
        found = common.lookup_table(wm, length)
        if found is not None:
            table, probes, threshold = found
            slots, slot_mask = address(table), table.shape[0] - 1
    anchored = spec.scheme in ANCHORED
    width = 2 if anchored else h + 1
    # one buffer: units [N, width] (anchored only), identities [N], prev [N], then the flags' N bytes
    out = np.empty((width if anchored else 0) * count + 2 * count + (count + 7) // 8, dtype=np.int64)
    at = address(out)
    head = (width if anchored else 0) * count
    identities_at, prev_at, flags_at = at + 8 * head, at + 8 * (head + count), at + 8 * (head + 2 * count)
    green_below = green_threshold(spec.gamma)
    if anchored:
        done = functions[0](ids.data_ptr(), length, h, spec.scheme == "selfhash", wm.vocab_size, token_values, salt,
                            own, vocab_mix, _MULTIPLIER, green_below, slots, slot_mask, probes, threshold, dedup,
                            flags_at, at, identities_at, prev_at, None if match is None else match.address)
    else:
        seeds = None
        if spec.scheme == "lefthash":
            seeds = _lefthash_seeds(tables, ids, h, count)
        done = functions[1](ids.data_ptr(), length, h, None if seeds is None else seeds.data_ptr(), unigram_seed,
                            1 if spec.scheme == "unigram" else 2, wm.vocab_size, vocab_mix, _MULTIPLIER, green_below,
                            slots, slot_mask, probes, threshold, dedup, flags_at, identities_at, prev_at,
                            None if match is None else match.address)
    if done != 0:
        return None
    if anchored:
        units = out[:head].reshape(count, width)
    else:
        units = np.lib.stride_tricks.sliding_window_view(ids.numpy(), h + 1).copy()
    identities = out[head:head + count].view(np.uint64)
    flags = out[head + 2 * count:].view(np.bool_)[:count]
    return flags, out[head + count:head + 2 * count], units, identities
