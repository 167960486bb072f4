"""Batched constraint masks: llguidance-style int32 bitmasks (bit j of word w = token id 32w + j) filled
per constrained row, turned into one -inf mask over the batch's constrained rows.

Rows without a constraint are never read or written. ``start_masks`` computes a step's masks on a
background thread so they can overlap the model's forward pass (llguidance releases the GIL).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


class RowConstraint(Protocol):
    """What the masks need of a row's constraint (generation/constraints/constraint.py implements it)."""

    eos_token_ids: Sequence[int]
    error: str | None
    last_allowed: int | None

    def _fill(self, out_row: torch.Tensor) -> None: ...


BITS_PER_WORD = 32  # one int32 word per 32 token ids
_BYTE_POPCOUNT = np.array([i.bit_count() for i in range(256)], dtype=np.uint8)  # numpy < 2 has no bitwise_count


def words_per_row(vocab_size: int) -> int:
    return -(-vocab_size // BITS_PER_WORD)


def clear_tail_(words: torch.Tensor, vocab_size: int) -> None:
    """Zero the bits past V in the last word, so counts and masks never see ids the model lacks."""
    spare = vocab_size % BITS_PER_WORD
    if spare:
        last = words.numpy().view(np.uint32)[..., -1]
        last &= np.uint32((1 << spare) - 1)


def count_bits(words: torch.Tensor) -> list[int]:
    """Set bits per bitmask row [R, W] (popcount, no unpacking)."""
    flat = words.numpy().view(np.uint32)
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(flat).sum(-1, dtype=np.int64).tolist()
    return _BYTE_POPCOUNT[flat.view(np.uint8)].sum(-1, dtype=np.int64).tolist()


def unpack_bits(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """BoolTensor[R, V] from int32 bitmask rows [R, W] (little-endian words: byte order = bit order)."""
    bits = np.unpackbits(words.numpy().view(np.uint8), axis=-1, bitorder="little")[..., :vocab_size]
    return torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bool)


def pack_ids(ids: Iterable[int], vocab_size: int) -> torch.Tensor:
    """int32 bitmask row [W] with the bits of ``ids`` set."""
    flags = np.zeros(words_per_row(vocab_size) * BITS_PER_WORD, dtype=bool)
    flags[list(ids)] = True
    return torch.from_numpy(np.packbits(flags, bitorder="little").view(np.int32).copy())


NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)


def block_rows_(logits: torch.Tensor, rows: list[int], blocked: torch.Tensor) -> None:
    """-inf in ``logits[rows[j]]`` where ``blocked[j]``, in place, touching no other row.

    On CPU this is numpy's putmask row by row: single-threaded and branch-free. torch's masked_fill_ /
    index_select measured 10-500x slower here (scattered masks; OpenMP kernels on 2 busy cores)."""
    if logits.device.type == "cpu" and logits.is_contiguous() and logits.dtype in NUMPY_DTYPES:
        target, mask = logits.numpy(), blocked.numpy()
        if len(rows) == logits.shape[0]:
            np.putmask(target, mask, -np.inf)
        else:
            for j, row in enumerate(rows):
                np.putmask(target[row], mask[j], -np.inf)
        return
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill_(blocked.to(logits.device, non_blocking=True), float("-inf"))


@dataclass(slots=True)
class ConstraintMasks:
    """One step's masks for a batch: ``rows`` (batch indices of constrained rows), ``blocked``
    BoolTensor[len(rows), V] (True = not allowed) and what each row's constraint allowed."""

    batch_size: int
    rows: list[int]
    blocked: torch.Tensor | None
    counts: list[int]  # 0 at a dead end, where the row is given EOS alone so it can end

    @property
    def allowed(self) -> torch.Tensor | None:
        return None if self.blocked is None else self.blocked.logical_not()

    def apply_(self, logits: torch.Tensor) -> list[int | None]:
        """-inf outside each constrained row's allowed set, in place; per-row allowed counts (None where unconstrained)."""
        counts: list[int | None] = [None] * self.batch_size
        if not self.rows:
            return counts
        if logits.shape[0] != self.batch_size:
            raise ValueError(f"logits: {logits.shape[0]} rows, masks were computed for {self.batch_size}")
        block_rows_(logits, self.rows, self.blocked)
        for j, n in zip(self.rows, self.counts):
            counts[j] = n
        return counts


def compute_masks(constraints: Sequence[RowConstraint | None], vocab_size: int) -> ConstraintMasks:
    """Ask each constrained row for its allowed set now (rows with None cost nothing)."""
    rows = [i for i, c in enumerate(constraints) if c is not None]
    if not rows:
        return ConstraintMasks(len(constraints), [], None, [])
    words = torch.zeros(len(rows), words_per_row(vocab_size), dtype=torch.int32)
    for j, i in enumerate(rows):
        constraints[i]._fill(words[j])
    clear_tail_(words, vocab_size)
    counts = count_bits(words)
    for j, i in enumerate(rows):
        c = constraints[i]
        c.last_allowed = counts[j]
        if counts[j] == 0 or c.error is not None:  # a dead end: end the row with EOS rather than sample from nothing
            c.error = c.error or "the constraint allows no token here"
            words[j] = pack_ids(c.eos_token_ids, vocab_size)
    blocked = unpack_bits(torch.from_numpy(np.invert(words.numpy())), vocab_size)
    return ConstraintMasks(len(constraints), rows, blocked, counts)


def apply_constraints_(logits: torch.Tensor, constraints: Sequence[RowConstraint | None]) -> list[int | None]:
    """Mask ``logits`` [B, V] in place to each constrained row's allowed set (-inf elsewhere).

    Returns each row's allowed count (None for unconstrained rows, which are left bit-for-bit untouched)."""
    if logits.dim() != 2 or logits.shape[0] != len(constraints):
        raise ValueError(f"logits shape {tuple(logits.shape)} does not match {len(constraints)} rows")
    return compute_masks(constraints, logits.shape[1]).apply_(logits)


_mask_thread: ThreadPoolExecutor | None = None
_mask_thread_lock = threading.Lock()


def start_masks(constraints: Sequence[RowConstraint | None], vocab_size: int) -> Future | None:
    """Compute the step's masks on a background thread (to overlap the model's forward pass).

    Returns a Future of ConstraintMasks, or None when no row is constrained. Do not advance the
    constraints until the result has been taken."""
    if all(c is None for c in constraints):
        return None
    global _mask_thread
    with _mask_thread_lock:
        if _mask_thread is None:
            _mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="constraint-masks")
    return _mask_thread.submit(compute_masks, list(constraints), vocab_size)


