"""Context functions: how the h prior tokens (and, for selfhash, the candidate) become seeds.

Every function takes ``contexts`` [N, h] (the h tokens before each scored position, oldest first)
and ``candidates`` [1 or N, C] (C = V for generation, C = 1 for detection) and returns seeds that
broadcast against ``candidates``: [N, 1] when the seed depends on the context only, [N, C] for
selfhash. Seeds are signed int64 PRF outputs (see prf.py).

* lefthash: PRF over all h context tokens jointly (one call per position; a table when h = 1).
* minhash:  min over the context of per-token PRF values: one edit moves few seeds.
* selfhash: min over the context and the candidate itself of per-token PRF values salted by the
            candidate, so the candidate chooses which context token anchors its seed (the
            "anchored minhash" of Kirchenbauer et al., reliability paper).
* unigram:  one key-wide seed: a fixed green list (Zhao et al., h = 0).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from functools import lru_cache

import numpy as np
import torch

from watermark.prf import KeyedPRF, splitmix64, to_signed64

LEFTHASH_CACHE_SIZE = 65536
SALT_OFFSET = 1 << 32  # selfhash salt table: splitmix64(v + 2**32), disjoint from T[v] = splitmix64(v)


class SeedTables:
    """Per-key, per-scheme material: the PRF and its single-token table, built lazily per device."""

    def __init__(self, secret: bytes, prf: str, scheme: str, vocab_size: int, context_width: int = 1) -> None:
        self.scheme = scheme
        # lefthash over h > 1 tokens hashes the joint context: no single-token table needed
        self.needs_table = scheme in ("minhash", "selfhash") or (scheme == "lefthash" and context_width == 1)
        self.vocab_size = vocab_size
        self.prf = KeyedPRF(secret, prf, scheme)
        self._cpu_table: torch.Tensor | None = None
        self._device: dict[str, dict[str, torch.Tensor]] = {}
        self._lock = threading.Lock()
        # lefthash with h > 1 makes one PRF call per position; repeated contexts (repetitive
        # text, the same prompt) hit this bounded cache
        self._lefthash_cache: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def lefthash_seed(self, context: tuple[int, ...]) -> int:
        cache = self._lefthash_cache
        with self._lock:
            hit = cache.get(context)
            if hit is not None:
                cache.move_to_end(context)
                return hit
        seed = self.prf.seed(context)
        with self._lock:
            cache[context] = seed
            if len(cache) > LEFTHASH_CACHE_SIZE:
                cache.popitem(last=False)
        return seed

    def __repr__(self) -> str:
        return f"SeedTables(scheme={self.scheme!r}, V={self.vocab_size}, prf={self.prf.algorithm!r})"

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        key = str(device)
        found = self._device.get(key)
        if found is not None:
            return found
        with self._lock:
            if key not in self._device:
                self._device[key] = self._build(device)
            return self._device[key]

    def _build(self, device: torch.device) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.scheme == "unigram":
            out["unigram"] = torch.tensor([[self.prf.seed(())]], dtype=torch.int64, device=device)
            return out
        if not self.needs_table:
            return out
        if self._cpu_table is None:
            self._cpu_table = self.prf.table(self.vocab_size)
        out["token"] = self._cpu_table.to(device)
        if self.scheme == "selfhash":
            salt = _salt_table(self.vocab_size).to(device)
            out["salt"] = salt
            out["self"] = out["token"] ^ salt
        return out


def selfhash_salts(vocab_size: int) -> np.ndarray:
    """selfhash's per-candidate salts (int64 [V]): key-free, public like the scheme's code."""
    return _salt_table(vocab_size).numpy().copy()


@lru_cache(maxsize=4)
def _salt_table(vocab_size: int) -> torch.Tensor:
    return torch.tensor([to_signed64(splitmix64(v + SALT_OFFSET)) for v in range(vocab_size)], dtype=torch.int64)


def selfhash_seeds(context_values: torch.Tensor, salt: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """min(own, min_j context_values[:, j] ^ salt): context_values [N, h] are table entries of the
    context tokens, ``salt``/``own`` [1 or N, C] the candidates' salt and salted self entries."""
    acc = own
    for j in range(context_values.shape[1]):
        acc = torch.minimum(acc, context_values[:, j:j + 1] ^ salt)
    return acc


def context_seeds(tables: SeedTables, contexts: torch.Tensor, candidates: torch.Tensor | None) -> torch.Tensor:
    """Seeds for each (context row, candidate); ``candidates=None`` means the whole vocabulary."""
    t = tables.tensors(contexts.device)
    scheme = tables.scheme
    if scheme == "unigram":
        return t["unigram"].expand(contexts.shape[0], 1)
    if scheme == "lefthash":
        if contexts.shape[1] == 1:
            return t["token"][contexts]  # PRF(key, [t]) is exactly the table entry
        seeds = [tables.lefthash_seed(tuple(r)) for r in contexts.tolist()]
        return torch.tensor(seeds, dtype=torch.int64, device=contexts.device).reshape(-1, 1)
    if scheme == "minhash":
        return t["token"][contexts].amin(dim=1, keepdim=True)
    if scheme == "selfhash":
        salt, own = t["salt"], t["self"]
        if candidates is None:
            salt, own = salt.unsqueeze(0), own.unsqueeze(0)
        else:
            salt, own = salt[candidates], own[candidates]
        return selfhash_seeds(t["token"][contexts], salt, own)
    raise ValueError(f"scheme: unknown {scheme!r}")


def secret_digest(secret: bytes) -> bytes:
    """A cache key for a secret that does not keep the secret itself in cache dictionaries."""
    return hashlib.sha256(b"provmark/cache-key\x00" + secret).digest()
