"""transformers' watermark (``WatermarkLogitsProcessor`` / ``WatermarkDetector``), reproduced.

Green lists are ``torch.randperm(V)`` prefixes drawn from a CPU generator seeded per context, as
transformers does, so the lists are equal token for token. This is the slow, unkeyed scheme we
support only to detect text watermarked elsewhere (and to generate it for tests); our own ``kgw``
specs never call randperm.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from watermark.config import HF_KIND, WatermarkSpec

HF_TABLE_SIZE = 1_000_003  # transformers' fixed_table size
HF_SELFHASH_CANDIDATES = 40  # transformers scores only the 40 most likely candidates under selfhash
GREENLIST_CACHE_SIZE = 1024


class HFGreenlists:
    def __init__(self, spec: WatermarkSpec, vocab_size: int) -> None:
        if spec.kind != HF_KIND:
            raise ValueError("HFGreenlists needs an hf: spec")
        self.spec = spec
        self.vocab_size = vocab_size
        self.greenlist_size = int(vocab_size * spec.gamma)
        rng = torch.Generator(device="cpu")
        rng.manual_seed(spec.hashing_key)
        self.fixed_table = torch.randperm(HF_TABLE_SIZE, generator=rng)
        self._cache: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def window(self) -> int:
        return self.spec.context_width

    def seed(self, sequence: list[int]) -> int:
        """transformers' ``set_seed`` on the last ``context_width`` tokens of ``sequence``."""
        window = torch.tensor(sequence[-self.window:], dtype=torch.int64)
        if self.spec.scheme == "selfhash":
            a = self.fixed_table[window % HF_TABLE_SIZE] + 1
            b = self.fixed_table[window[-1] % HF_TABLE_SIZE] + 1
            seed = int((self.spec.hashing_key * a * b).min().item())  # int64 wrap-around, as upstream
        else:
            seed = self.spec.hashing_key * int(window[-1].item())
        return seed % (2**64 - 1)

    def greenlist(self, seed: int) -> torch.Tensor:
        """Green token ids for a seed (cached; transformers re-draws them every time)."""
        with self._lock:
            hit = self._cache.get(seed)
            if hit is not None:
                self._cache.move_to_end(seed)
                return hit
        rng = torch.Generator(device="cpu")
        rng.manual_seed(seed)
        ids = torch.randperm(self.vocab_size, generator=rng)[: self.greenlist_size]
        with self._lock:
            self._cache[seed] = ids
            if len(self._cache) > GREENLIST_CACHE_SIZE:
                self._cache.popitem(last=False)
        return ids

    def is_green(self, prefix: list[int], target: int) -> bool:
        """Detection: is ``target`` green after ``prefix`` (for selfhash the prefix ends with it)."""
        return bool((self.greenlist(self.seed(prefix)) == target).any())

    def bias_row(self, history: list[int], logits_row: torch.Tensor) -> None:
        """transformers' processor on one row, in place."""
        if len(history) < self.window:
            return
        if self.spec.scheme == "lefthash":
            ids = self.greenlist(self.seed(history))
        else:
            _, order = logits_row.sort(dim=-1, descending=True)
            chosen = []
            for candidate in order[:HF_SELFHASH_CANDIDATES].tolist():
                if self.is_green(history + [candidate], candidate):
                    chosen.append(candidate)
            ids = torch.tensor(chosen, dtype=torch.int64)
        ids = ids.to(logits_row.device)
        logits_row[ids] = logits_row[ids] + self.spec.delta
