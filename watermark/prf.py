"""The keyed PRF and the vectorised token mixer.

Context seeds come from a keyed PRF (HMAC-SHA256, or SHA3-256 keyed by prefixing the key, which is
a sound MAC since SHA-3 resists length extension) truncated to 64 bits and read as a signed int64
(torch has no unsigned 64-bit arithmetic). At most one PRF call is made per position; per-token
tables (V calls, once per key) serve the schemes whose seeds combine single-token values.

Membership is decided by ``mix64(seed, token)``, a fixed integer mixer that is one expression over
tensors, so the same code scores one token (detection) or the whole vocabulary (generation)::

    T[v]    = splitmix64(v)                        fixed, key-free table of the vocabulary
    mix64   = (seed ^ T[v]) * ((seed * K) | 1)     wrapping 64-bit arithmetic
    green   = mix64 < -2**63 + floor(gamma * 2**64)   as signed int64

For a fixed seed, ``seed ^ T[v]`` runs over distinct values and multiplying by an odd number is a
bijection mod 2**64, so each token is green with probability gamma; the multiplier depends on the
seed so that two seeds do not merely shift one another's lists.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import threading
from collections.abc import Sequence
from functools import lru_cache

import torch

from watermark.prf_kernel import hmac_sha256_words

DOMAIN = b"provmark/kgw/v1"  # domain separation for every PRF input
MASK64 = (1 << 64) - 1
SEED_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)  # golden-ratio constant as a signed int64 (odd)
_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_M1 = 0xBF58476D1CE4E5B9
_SPLITMIX_M2 = 0x94D049BB133111EB


def to_signed64(value: int) -> int:
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def splitmix64(x: int) -> int:
    """Steele et al.'s SplitMix64 output function on one unsigned 64-bit integer."""
    z = (x + _SPLITMIX_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * _SPLITMIX_M1) & MASK64
    z = ((z ^ (z >> 27)) * _SPLITMIX_M2) & MASK64
    return z ^ (z >> 31)


def green_threshold(gamma: float) -> int:
    """The signed int64 below which a mixed value is green: a fraction gamma of all 2**64 values."""
    return int(gamma * (1 << 64)) - (1 << 63)


_HMAC_BLOCK = 64  # SHA-256's block size: HMAC pads (or first hashes) the key to it (RFC 2104)


def _hmac_sha256_blocks(key: bytes) -> tuple[bytes, bytes]:
    """HMAC-SHA256's two key blocks (RFC 2104, as ``hmac`` computes them): the key (hashed first when
    longer than a block) zero-padded to 64 bytes, XOR ipad and XOR opad."""
    if len(key) > _HMAC_BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_HMAC_BLOCK, b"\x00")
    return bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)


class KeyedPRF:
    """PRF_key(domain, scheme, token ids) -> signed 64-bit seed. Never exposes the key."""

    __slots__ = ("_prefixed", "_hmac_blocks", "_hmac_states", "_message_prefix", "algorithm")

    def __init__(self, key: bytes, algorithm: str = "hmac-sha256", scheme: str = "lefthash") -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
            raise ValueError("watermark key: expected at least 16 secret bytes")
        prefix = DOMAIN + b"\x00" + scheme.encode() + b"\x00"
        if algorithm == "hmac-sha256":
            self._prefixed = hmac.new(bytes(key), prefix, hashlib.sha256)
            # for seed_words: the key blocks (the C batch) and the hash states after them (hashlib)
            self._hmac_blocks = _hmac_sha256_blocks(bytes(key))
            inner = hashlib.sha256(self._hmac_blocks[0])
            inner.update(prefix)
            self._hmac_states = (inner, hashlib.sha256(self._hmac_blocks[1]))
        elif algorithm == "sha3-256":
            # key length first, so (key, message) pairs cannot be re-split
            self._prefixed = hashlib.sha3_256(struct.pack("<I", len(key)) + bytes(key) + prefix)
            self._hmac_blocks = self._hmac_states = None
        else:
            raise ValueError(f"prf: expected hmac-sha256 or sha3-256, got {algorithm!r}")
        self._message_prefix = prefix
        self.algorithm = algorithm

    def __repr__(self) -> str:
        return f"KeyedPRF(algorithm={self.algorithm!r})"

    def seed(self, token_ids: Sequence[int]) -> int:
        """One PRF call over the token ids (each as an unsigned 32-bit little-endian integer)."""
        h = self._prefixed.copy()
        h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
        return int.from_bytes(h.digest()[:8], "little", signed=True)

    def seed_words(self, messages: list[bytes]) -> bytes:
        """For each message (token ids already packed as ``seed`` packs them) the 8 bytes ``seed`` reads,
        concatenated: ``seed(ids)`` is the i-th 8 bytes read as a little-endian signed integer. The batch
        path of per-context seeding: HMAC messages of one width go to the C kernel when it is built
        (``watermark.prf_kernel``), the others to hashlib (no struct packing, no Python int per message)."""
        if messages and len(set(map(len, messages))) == 1:
            words = self.packed_seed_words(b"".join(messages), len(messages[0]))
            if words is not None:
                return words
        out = []
        if self._hmac_states is not None:
            inner_copy, outer_copy = self._hmac_states[0].copy, self._hmac_states[1].copy
            for message in messages:
                inner = inner_copy()
                inner.update(message)
                outer = outer_copy()
                outer.update(inner.digest())
                out.append(outer.digest()[:8])
        else:
            copy = self._prefixed.copy
            for message in messages:
                h = copy()
                h.update(message)
                out.append(h.digest()[:8])
        return b"".join(out)

    def packed_seed_words(self, messages: bytes, width: int) -> bytes | None:
        """``seed_words`` for messages of ``width`` bytes each, already concatenated, from the C kernel; None
        where it does not serve (no kernel, sha3-256, width 0): the caller then takes ``seed_words``."""
        if self._hmac_blocks is None:
            return None
        return hmac_sha256_words(*self._hmac_blocks, self._message_prefix, messages, width)

    def table(self, vocab_size: int) -> torch.Tensor:
        """PRF of every single token, [V] int64: V PRF calls, done once per key and scheme."""
        pack = struct.Struct("<I").pack
        base = self._prefixed
        out = []
        for v in range(vocab_size):
            h = base.copy()
            h.update(pack(v))
            out.append(int.from_bytes(h.digest()[:8], "little", signed=True))
        return torch.tensor(out, dtype=torch.int64)


@lru_cache(maxsize=8)
def _vocab_table_cpu(vocab_size: int) -> torch.Tensor:
    return torch.tensor([to_signed64(splitmix64(v)) for v in range(vocab_size)], dtype=torch.int64)


_device_tables: dict[tuple[int, str], torch.Tensor] = {}
_device_lock = threading.Lock()


def vocab_mix_table(vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """T[v] = splitmix64(v) for v < V as int64, cached per device."""
    key = (vocab_size, str(torch.device(device)))
    table = _device_tables.get(key)
    if table is None:
        with _device_lock:
            table = _device_tables.get(key)
            if table is None:
                table = _vocab_table_cpu(vocab_size).to(device)
                _device_tables[key] = table
    return table


def mix64(seeds: torch.Tensor, mixed_tokens: torch.Tensor) -> torch.Tensor:
    """The mixer over broadcast shapes; ``mixed_tokens`` are T[v] values (see vocab_mix_table)."""
    return (seeds ^ mixed_tokens) * ((seeds * SEED_MULTIPLIER) | 1)


def mix64_reference(seed: int, token: int) -> int:
    """Pure-Python mix64 on one (seed, token): the specification the tensor code is tested against."""
    s = seed & MASK64
    multiplier = ((s * (SEED_MULTIPLIER & MASK64)) & MASK64) | 1
    return to_signed64(((s ^ splitmix64(token)) * multiplier) & MASK64)
