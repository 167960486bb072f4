"""Watermark: a green-list spec (``kgw:``, ``hf:``) bound to its key material and vocabulary size — what the
engine applies and the detector scores. ``watermark.scheme.make_watermark`` builds any family's watermark."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import torch

from watermark.config import WatermarkSpec
from watermark.greenlist import bias_logits, bias_logits_rows, green
from watermark.hf_compat import HFGreenlists
from watermark.key_info import key_fingerprint
from watermark.prf import green_threshold, mix64, vocab_mix_table
from watermark.seeding import SeedTables, secret_digest
from watermark.units import anchor_values, identities

_TABLES_CACHE_SIZE = 32  # keys x schemes kept warm per process (tables are ~400 KB each)
_tables_cache: OrderedDict[tuple, SeedTables] = OrderedDict()
_tables_lock = threading.Lock()


def _seed_tables(secret: bytes, spec: WatermarkSpec, vocab_size: int) -> SeedTables:
    key = (secret_digest(secret), spec.prf, spec.scheme, spec.context_width, vocab_size)
    with _tables_lock:
        found = _tables_cache.get(key)
        if found is None:
            found = SeedTables(secret, spec.prf, spec.scheme, vocab_size, spec.context_width)
            _tables_cache[key] = found
            if len(_tables_cache) > _TABLES_CACHE_SIZE:
                _tables_cache.popitem(last=False)
        else:
            _tables_cache.move_to_end(key)
        return found


class Watermark:
    """``Watermark(spec, secret, vocab_size, key_id)``; ``secret`` is ignored (may be None) for hf specs.

    ``public_half``: the detection half of a two-part key (``watermark.public_key``): generation then biases
    towards both halves' green lists; detection methods score the private half (``secret``), and
    ``public_mark()`` is the public half's own Watermark."""

    def __init__(self, spec: WatermarkSpec | str, secret: bytes | None, vocab_size: int,
                 key_id: str | None = None, public_half: bytes | None = None) -> None:
        self.spec = WatermarkSpec.parse(spec)
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.key_id = key_id
        self.fingerprint = self.spec.fingerprint(vocab_size)
        self._tables: SeedTables | None = None
        self._public_tables: SeedTables | None = None
        self._public: Watermark | None = None  # the public half's own Watermark, built on first use
        self._public_fingerprint: str | None = None  # its key fingerprint, computed on first use
        self._hf: HFGreenlists | None = None
        # rows whose watermarks share this key are biased in one batched call (see WatermarkProcessor)
        self.batch_key: tuple = (self.spec, vocab_size)
        if self.spec.needs_key:
            if not secret:
                raise ValueError("a kgw watermark needs a key: create one with `provmark keys create`")
            self.batch_key = (self.spec, vocab_size, secret_digest(bytes(secret)))
            self._tables = _seed_tables(bytes(secret), self.spec, vocab_size)
            if public_half is not None:
                self._public_half = bytes(public_half)
                self._public_tables = _seed_tables(self._public_half, self.spec, vocab_size)
                self.batch_key += (secret_digest(self._public_half),)
        else:
            if public_half is not None:
                raise ValueError("an hf spec has no keyring key, so no public half")
            self._hf = HFGreenlists(self.spec, vocab_size)

    @property
    def has_public_half(self) -> bool:
        return self._public_tables is not None

    @property
    def public_fingerprint(self) -> str:
        """The published half's key fingerprint (``watermark.key_info.key_fingerprint``)."""
        if self._public_tables is None:
            raise ValueError(f"key {self.key_id} is not a two-part key")
        if self._public_fingerprint is None:  # an HMAC per verdict otherwise
            self._public_fingerprint = key_fingerprint(self._public_half)
        return self._public_fingerprint

    def public_mark(self) -> Watermark:
        """The public half's Watermark (what a verifier holding the published half scores with)."""
        if self._public_tables is None:
            raise ValueError(f"key {self.key_id} is not a two-part key")
        if self._public is None:
            self._public = Watermark(self.spec, self._public_half, self.vocab_size, self.key_id)
        return self._public

    def __repr__(self) -> str:
        return f"Watermark({self.spec.format()!r}, key_id={self.key_id!r}, V={self.vocab_size})"

    @property
    def context_width(self) -> int:
        """Tokens of history a position needs before it can be biased or scored."""
        if self._hf is not None and self.spec.scheme == "selfhash":
            return self.spec.context_width - 1  # transformers' selfhash window includes the candidate
        return self.spec.context_width

    @property
    def gamma(self) -> float:
        return self.spec.gamma

    # ---- generation -------------------------------------------------------------------------
    def green_mask(self, contexts: torch.Tensor) -> torch.Tensor:
        """[B, V] green mask for rows whose last ``context_width`` tokens are ``contexts`` [B, h]."""
        if self._tables is None:
            if self.spec.scheme != "lefthash":
                raise NotImplementedError("hf selfhash has no whole-vocabulary green list (see bias)")
            mask = torch.zeros(contexts.shape[0], self.vocab_size, dtype=torch.bool, device=contexts.device)
            for row, context in enumerate(contexts.tolist()):
                mask[row, self._hf.greenlist(self._hf.seed(context)).to(contexts.device)] = True
            return mask
        return green(self._tables, self.spec.gamma, contexts, None)

    def bias(self, logits: torch.Tensor, histories: list[list[int]], code: list[bool] | None = None) -> torch.Tensor:
        """Bias rows of ``logits`` [B, V] whose histories are long enough; in place, returned.

        Soft: +delta on green logits (code_delta instead on rows whose ``code`` flag is set, when the spec has one).
        Hard: red logits to -inf."""
        h = self.context_width
        if self._hf is not None:
            for row, history in enumerate(histories):
                self._hf.bias_row(list(history), logits[row])
            return logits
        ready = [i for i, hist in enumerate(histories) if len(hist) >= h]
        if not ready:
            return logits
        contexts = torch.tensor([list(histories[i][len(histories[i]) - h:]) if h else [] for i in ready],
                                dtype=torch.int64, device=logits.device).reshape(len(ready), h)
        target = logits if len(ready) == logits.shape[0] else logits[ready]
        self._bias_rows(target, contexts, self._code_rows(ready, code))
        if self._public_tables is not None:  # a two-part key: the public half's list gets its own delta
            bias_logits(target, self._public_tables, self.spec.gamma, self.spec.delta, self.spec.hard, contexts)
        if target is not logits:
            logits[ready] = target
        return logits

    def _code_rows(self, ready: list[int], code: list[bool] | None) -> list[int]:
        """The rows of ``target`` (local indices into ``ready``) that take code_delta; [] when none does."""
        if code is None or self.spec.hard or self.spec.code_delta is None or self.spec.code_delta == self.spec.delta:
            return []
        return [j for j, i in enumerate(ready) if code[i]]

    def _bias_rows(self, target: torch.Tensor, contexts: torch.Tensor, code_rows: list[int]) -> None:
        """One pass over every row at delta, or at code_delta when all are code; else each row at its own delta, in one
        pass where the bias backend takes per-row deltas (the C++ kernel), else as two groups (same green lists)."""
        spec = self.spec
        if not code_rows or len(code_rows) == target.shape[0]:
            delta = spec.code_delta if code_rows else spec.delta
            bias_logits(target, self._tables, spec.gamma, delta, spec.hard, contexts)
            return
        chosen = set(code_rows)
        deltas = [spec.code_delta if j in chosen else spec.delta for j in range(target.shape[0])]
        bias_logits_rows(target, self._tables, spec.gamma, deltas, contexts)

    # ---- detection ----------------------------------------------------------------------------
    def green_flags(self, token_ids: torch.Tensor | list[int]) -> torch.Tensor:
        """Bool [T - h]: is token i (i >= h) green given the h tokens before it."""
        return self.scored_positions(token_ids)[0]

    def scored_positions(self, token_ids: torch.Tensor | list[int], with_identities: bool = False):
        """Green flags [T - h] and each position's dedup unit [T - h, k] from one pass (and, with
        ``with_identities``, each unit's key-free identity, see ``unit_identities``).

        Two positions with equal units have equal flags by construction, so a unit is one coin and
        is counted once under dedup. The unit is the (h + 1)-gram, except for minhash and selfhash,
        where the flag depends only on (seed, token) and distinct n-grams often share that pair
        (the same anchor token before the same word): their unit is that pair."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        h = self.context_width
        ngrams = self.ngrams(ids)
        named = np.zeros(ngrams.shape[0], dtype=np.uint64)
        if ngrams.shape[0] == 0:
            return (torch.zeros(0, dtype=torch.bool), ngrams) + ((named,) if with_identities else ())
        if self._hf is not None:
            selfhash = self.spec.scheme == "selfhash"
            seq = ids.tolist()
            flags = [self._hf.is_green(seq[i - h: i + 1] if selfhash else seq[i - h: i], seq[i])
                     for i in range(h, len(seq))]
            return (torch.tensor(flags, dtype=torch.bool), ngrams) + ((named,) if with_identities else ())
        scheme = self.spec.scheme
        candidates = ngrams[:, h:]
        if scheme in ("minhash", "selfhash"):
            # the seed is the min of the anchor values; its argmin names the anchor (one pass for both)
            t = self._tables.tensors(ids.device)
            seeds, anchors = anchor_values(scheme, t["token"], t.get("salt"), t.get("self"), ngrams).min(dim=1)
            seeds = seeds.unsqueeze(1)
            token_mix = vocab_mix_table(self.vocab_size, ids.device)[candidates]
            flags = mix64(seeds, token_mix) < green_threshold(self.spec.gamma)
            units = torch.cat([seeds, candidates], dim=1)
            if with_identities:
                named = identities(scheme, ngrams.numpy(), anchors.numpy())
        else:
            flags, seeds = green(self._tables, self.spec.gamma, ngrams[:, :h], candidates, return_seeds=True)
            units = ngrams
            if with_identities:
                named = identities(scheme, ngrams.numpy(), None)
        return (flags[:, 0], units) + ((named,) if with_identities else ())

    def unit_identities(self, token_ids: torch.Tensor | list[int]) -> np.ndarray:
        """uint64 [T - h]: each scored position's unit named without the key (``watermark.units``), so
        units that human texts share can be looked up in a key-free table. hf specs: not named (zeros)."""
        return self.scored_positions(token_ids, with_identities=True)[2]

    def ngram_identities(self, ngrams: torch.Tensor | np.ndarray) -> np.ndarray:
        """uint64 [M]: the unit (``watermark.units``) each row of ``ngrams`` [M, h + 1] (context, then token)
        forms under this key. For minhash and selfhash the key chooses which context token anchors, so this
        is keyed, unlike the identities themselves. hf specs name no units."""
        if self._tables is None:
            raise ValueError(f"{self.spec.format()}: an hf spec names no units")
        ngrams = torch.as_tensor(ngrams, dtype=torch.int64)
        anchors = None
        if self.spec.scheme in ("minhash", "selfhash"):
            t = self._tables.tensors(ngrams.device)
            anchors = anchor_values(self.spec.scheme, t["token"], t.get("salt"), t.get("self"), ngrams).argmin(dim=1).numpy()
        return identities(self.spec.scheme, ngrams.numpy(), anchors)

    def ngrams(self, token_ids: torch.Tensor | list[int]) -> torch.Tensor:
        """[T - h, h + 1]: each scored position's context followed by its token (the dedup unit)."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        n = self.context_width + 1
        if ids.shape[0] < n:
            return ids.new_zeros((0, n))
        return ids.unfold(0, n, 1)
