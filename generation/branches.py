"""Branches of one prompt over the engine's paged KV pool: beam search's beams and n/best_of's siblings.

The prompt is prefilled once, as the scheduler admits a prompt (generation/block_manager.py): the blocks of
its longest prefix-cached run of full blocks are shared and those tokens skipped, the rest is computed into
fresh blocks, and its full blocks are registered for later prompts. Every branch's block table then lists the
prompt's blocks, one reference per branch: the prompt's keys and values are stored once however many
branches read them. A branch about to write into a block another table holds too (the prompt's partial last
block, or a block two forked beams share) first gets its own copy of that block (copy on write); the last
holder writes in place. ``reorder`` (beam selection, dropping finished siblings) re-points block tables and
moves reference counts; keys and values never move. Each step is one ``ModelRunner.decode`` over the
branches' own tables, so the engine's decode kernels serve branches as they serve requests. ``close`` (or
leaving the ``with`` block, an exception included) drops every reference the branches hold.

Locking: each call (``prefill``, ``step``, ``reorder``, ``close``) holds the engine's step lock while it runs,
not the whole decode. The lock guards what a call shares with ``Engine.step``: the block manager's counts and
free list, and the runner's one forward plan. Between calls the engine's own requests keep stepping, so a
long beam search does not stall every stream for its whole length; the blocks the branches hold stay theirs
meanwhile (reference counts: the scheduler only frees and preempts its own sequences, and eviction only takes
blocks nobody holds).

The pool is shared: when the blocks a call needs are not free (other requests hold them, or the pool is
too small for this many branches), it raises RuntimeError naming the count and takes none; nothing any
other sequence holds is touched.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

import torch

from generation.block_manager import BlockManager
from generation.runner import ModelRunner


@dataclass(slots=True)
class _Prompt:
    """The prompt's hold on its blocks while it is prefilled (what BlockManager reads of a sequence)."""

    all_ids: list[int]
    cache_lookup: bool
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached: int = 0
    num_registered: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.all_ids)


class BranchRunner:
    """Prefill ``prompt_ids`` once, then step up to ``n_branches`` continuations of it in one batch, for up to
    ``max_new`` steps. ``prefill() -> logits [1, V]``, ``step(tokens) -> logits [branches, V]``,
    ``reorder(index)``, ``close()``; a context manager. ``cache_lookup=False`` computes the whole prompt even
    where its prefix is cached (a seeded request: its tokens must not depend on what ran before)."""

    def __init__(self, runner: ModelRunner, blocks: BlockManager, lock: threading.Lock, prompt_ids: list[int],
                 n_branches: int, max_new: int, cache_lookup: bool = True) -> None:
        if not isinstance(prompt_ids, (list, tuple)) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt_ids):
            raise TypeError("branches: prompt_ids must be a list of int token ids")
        if not prompt_ids:
            raise ValueError("branches: prompt_ids is empty (no tokens)")
        for name, value in (("n_branches", n_branches), ("max_new", max_new)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"branches: {name}={value!r} must be an int >= 1")
        max_model_len = runner.cache.config.max_model_len
        if len(prompt_ids) + max_new > max_model_len:
            raise ValueError(f"branches: a {len(prompt_ids)}-token prompt and {max_new} new tokens exceed "
                             f"max_model_len={max_model_len}")
        self._runner, self._blocks, self._lock = runner, blocks, lock
        self._prompt = _Prompt(list(prompt_ids), bool(cache_lookup))
        self.max_branches, self.max_new = n_branches, max_new
        self.tables: list[list[int]] = []  # one block table per live branch (after prefill)
        self.generated = 0  # tokens each branch has fed (its next position is the prompt length plus this)
        self.cached_tokens = 0  # prompt tokens found in the prefix cache (not computed)
        self.prefilled_tokens = 0  # prompt tokens the prefill computed
        self._prefilled = self._closed = False

    @property
    def branches(self) -> int:
        """Live branches (``n_branches`` until the first reorder)."""
        return len(self.tables) if self._prefilled else self.max_branches

    def __enter__(self) -> BranchRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise RuntimeError(f"{call}: the branches are closed (their blocks went back to the pool)")

    def prefill(self) -> torch.Tensor:
        """Compute the prompt's uncached tokens once; logits ``[1, V]`` of its last token. Call once, first."""
        self._check_open("prefill")
        if self._prefilled:
            raise RuntimeError("prefill: the prompt is already prefilled")
        prompt, blocks = self._prompt, self._blocks
        length = prompt.num_tokens
        with self._lock:
            found = blocks.lookup(prompt)
            need = blocks.cost(prompt, found, length)
            if need > blocks.num_free:
                raise RuntimeError(f"branches: the prompt needs {need} free KV blocks of {blocks.block_size} "
                                   f"tokens, {blocks.num_free} of {blocks.num_blocks} are free")
            blocks.admit(prompt, found)
            try:
                start = prompt.num_cached
                logits = self._runner.prefill([prompt.all_ids[start:]], [start], [prompt.block_table])
                prompt.num_cached = length
                blocks.register(prompt)
                self.tables = [list(prompt.block_table) for _ in range(self.max_branches)]
                for table in self.tables:
                    blocks.share(table)
            finally:
                blocks.release(prompt)  # the branches hold the prompt's blocks now (or, on error, nobody)
            self.cached_tokens, self.prefilled_tokens = start, length - start
            self._prefilled = True
        return logits

    def step(self, tokens: torch.Tensor | list[int]) -> torch.Tensor:
        """Feed one token per live branch; logits ``[branches, V]`` of each branch's next token."""
        self._check_open("step")
        if not self._prefilled:
            raise RuntimeError("step: call prefill() first")
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self._runner.device)
        if tokens.shape != (len(self.tables),):
            raise ValueError(f"step: expected {len(self.tables)} tokens (one per branch), got shape {tuple(tokens.shape)}")
        if self.generated >= self.max_new:
            raise RuntimeError(f"step: the branches hold {self.max_new} generated tokens each; all used")
        position = self._prompt.num_tokens + self.generated
        with self._lock:
            self._own_block(position // self._blocks.block_size)
            logits = self._runner.decode(tokens, [position] * len(self.tables), self.tables)
        self.generated += 1
        return logits

    def _own_block(self, index: int) -> None:
        """Every branch's block ``index`` held by that branch alone: a new block past its table's end, a copy of a
        block another table holds (copy on write; the last holder keeps the original)."""
        blocks, counts = self._blocks, self._blocks.ref_counts
        copies: Counter[int] = Counter()
        need = 0
        for table in self.tables:  # count first: a shortage takes nothing
            if index == len(table):
                need += 1
            elif counts[table[index]] - copies[table[index]] > 1:
                copies[table[index]] += 1
                need += 1
        if need > blocks.num_free:
            raise RuntimeError(f"branches: step {self.generated + 1} of {len(self.tables)} branches needs {need} "
                               f"more KV blocks of {blocks.block_size} tokens, {blocks.num_free} of "
                               f"{blocks.num_blocks} are free (other requests hold the rest, or the pool is too "
                               "small for this many branches)")
        for table in self.tables:
            if index == len(table):
                table.append(blocks.take())
            elif counts[table[index]] > 1:
                shared, own = table[index], blocks.take()
                self._runner.cache.copy_block(shared, own)
                blocks.drop([shared])
                table[index] = own

    def reorder(self, index: torch.Tensor | list[int]) -> None:
        """Branches ``index`` go on, in that order (repeats fork a branch): beam selection or dropping
        finished siblings. Block tables are re-pointed and reference counts moved; no key is copied."""
        self._check_open("reorder")
        if not self._prefilled:
            raise RuntimeError("reorder: call prefill() first")
        index = [int(i) for i in torch.as_tensor(index, dtype=torch.long).reshape(-1).tolist()]
        if not 1 <= len(index) <= self.max_branches:
            raise ValueError(f"reorder: index must list 1..{self.max_branches} branches, got {len(index)}")
        if any(not 0 <= i < len(self.tables) for i in index):
            raise ValueError(f"reorder: branch ids must lie in [0, {len(self.tables)})")
        if index == list(range(len(self.tables))):
            return
        with self._lock:
            tables = [list(self.tables[i]) for i in index]
            for table in tables:
                self._blocks.share(table)
            for table in self.tables:
                self._blocks.drop(table)
            self.tables = tables

    def close(self) -> None:
        """Give back every block the branches hold (idempotent)."""
        if self._closed:
            return
        with self._lock:
            for table in self.tables:
                self._blocks.drop(table)
            self.tables = []
            self._closed = True
