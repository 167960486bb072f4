"""Block manager: the paged KV cache's blocks (generation/kv_cache.py), who holds them, which are free, and
which hold a known prefix (automatic prefix caching).

Blocks are handed out as sequences grow (``block_size`` tokens each) and come back when a sequence finishes
or is preempted. Each block carries a reference count: the number of sequences whose block table lists it.

Prefix caching: once a block is full and computed, it is registered under the hash of its tokens chained
to its parent's hash (SHA-256 of the parent's hash and the block's token ids: the same hash means the same
tokens at the same positions from the start, hence the same keys and values; the model and dtype are
fixed per engine). A new sequence looks its prompt's full blocks up in that order and shares every block
found (its reference count goes up), so only the rest of its prompt is computed. A block nobody holds any
longer keeps its contents and hash: it stays findable until it is reused, least recently released first,
once no block without a hash is free.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from generation.sequence import Sequence


def chain_hash(parent: bytes, tokens: list[int]) -> bytes:
    """The hash of a block holding ``tokens`` after the blocks hashed to ``parent``."""
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class BlockManager:
    """Free blocks, reference counts and (with ``prefix_caching``) the hash -> block index."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager: {num_blocks} blocks of {block_size} tokens")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.ref_counts = [0] * num_blocks
        # a stack: the most recently freed block is reused first (its pages are already backed by memory)
        self.free = list(range(num_blocks - 1, -1, -1))
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block holding those tokens
        self.evictable: OrderedDict[int, None] = OrderedDict()  # hashed, held by nobody; oldest release first
        self.prompt_tokens = 0  # prompt tokens looked up, and how many of them were found cached
        self.hit_tokens = 0

    @property
    def num_free(self) -> int:
        """Blocks a sequence can take now (free, or cached but held by nobody)."""
        return len(self.free) + len(self.evictable)

    @property
    def num_used(self) -> int:
        """Blocks some sequence holds."""
        return self.num_blocks - self.num_free

    @property
    def hit_rate(self) -> float:
        """Share of the looked-up prompt tokens that came from the cache."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` positions."""
        return -(-tokens // self.block_size)

    def missing(self, seq: Sequence, tokens: int) -> int:
        """Blocks ``seq`` lacks to hold ``tokens`` positions."""
        return max(0, self.blocks_for(tokens) - len(seq.block_table))

    def hashes(self, seq: Sequence, count: int) -> list[bytes]:
        """The chain hashes of ``seq``'s first ``count`` full blocks (computed once, kept on the sequence)."""
        known, ids, size = seq.block_hashes, seq.all_ids, self.block_size
        while len(known) < count:
            i = len(known)
            known.append(chain_hash(known[-1] if known else b"", ids[i * size:(i + 1) * size]))
        return known[:count]

    def lookup(self, seq: Sequence) -> list[int]:
        """The cached blocks of ``seq``'s longest cached prefix of full blocks, never its last token (that
        one is computed for its logits). Nothing for a sequence that opted out (``seq.cache_lookup``)."""
        if not self.prefix_caching or not seq.cache_lookup:
            return []
        found = []
        for h in self.hashes(seq, (seq.num_tokens - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def uncomputed_hash(self, seq: Sequence, found: int) -> bytes | None:
        """The hash of ``seq``'s first full block past the ``found`` cached ones, or None if there is none."""
        if not self.prefix_caching or not seq.cache_lookup or found >= (seq.num_tokens - 1) // self.block_size:
            return None
        return self.hashes(seq, found + 1)[found]

    def cost(self, seq: Sequence, found: list[int], tokens: int) -> int:
        """Free blocks admitting ``seq`` with ``found`` shared takes, to hold ``tokens`` positions."""
        idle = sum(1 for block in found if self.ref_counts[block] == 0)
        return max(0, self.blocks_for(tokens) - len(found)) + idle

    def admit(self, seq: Sequence, found: list[int]) -> None:
        """Give a waiting ``seq`` the ``found`` cached blocks (it skips their tokens) and blocks for the rest."""
        self.share(found)
        seq.block_table = list(found)
        seq.num_registered = len(found)
        seq.num_cached = len(found) * self.block_size
        if self.prefix_caching and seq.cache_lookup:
            self.prompt_tokens += seq.num_tokens
            self.hit_tokens += seq.num_cached
        if not self.grow(seq, seq.num_tokens):
            raise RuntimeError("BlockManager.admit: too few free blocks (check cost() first)")

    def grow(self, seq: Sequence, tokens: int) -> bool:
        """Give ``seq`` blocks for ``tokens`` positions; False (nothing taken) when too few are free."""
        need = self.missing(seq, tokens)
        if need > self.num_free:
            return False
        for _ in range(need):
            seq.block_table.append(self.take())
        return True

    def share(self, blocks: list[int]) -> None:
        """One more holder for each of ``blocks`` (a block held by nobody stops being evictable)."""
        for block in blocks:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
            self.ref_counts[block] += 1

    def take(self) -> int:
        """A block for one holder (reference count 1): a free one, else the least recently released cached
        one (its prefix is forgotten). Check ``num_free`` first."""
        if self.free:
            block = self.free.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            h = self.block_hash[block]
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def register(self, seq: Sequence) -> None:
        """Make ``seq``'s full, computed blocks findable by their hash (after a step computed them)."""
        if not self.prefix_caching:
            return
        full = min(seq.num_cached // self.block_size, len(seq.block_table))
        if full <= seq.num_registered:
            return
        hashes = self.hashes(seq, full)
        for i in range(seq.num_registered, full):
            block, h = seq.block_table[i], hashes[i]
            if self.block_hash[block] is None and h not in self.cached:  # else an equal block is known already
                self.block_hash[block] = h
                self.cached[h] = block
        seq.num_registered = full

    def release(self, seq: Sequence) -> None:
        """Drop ``seq``'s hold on its blocks; a block nobody holds is free again (a cached one stays findable
        until reused)."""
        self.drop(seq.block_table)
        seq.block_table = []
        seq.num_cached = seq.num_registered = 0

    def drop(self, blocks: list[int]) -> None:
        """One holder fewer for each of ``blocks``; a block nobody holds is free again (a cached one stays
        findable until reused). The last block goes back first, so the first is reused last."""
        for block in reversed(blocks):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_hash[block] is not None:
                    self.evictable[block] = None
                else:
                    self.free.append(block)
