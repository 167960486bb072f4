"""Drafters for speculative decoding: prompt lookup (n-gram copies from the context) and a draft model.

A drafter's ``propose(history, k, positions)`` returns up to ``k`` tokens and their proposal
distributions q [k, V] (None when the proposal is deterministic or the request is greedy);
``rollback(length)`` tells it which prefix of the sequence survived verification.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from generation.decoding.speculative.cache import CachedLM
from generation.decoding.speculative.positions import RequestPositions
from generation.decoding.speculative.verify import draw_token
from generation.models import load_model

DRAFTER_CACHE_SIZE = 2  # draft models kept loaded per process (a 135M model is ~0.5 GB in float32)
_drafters: OrderedDict[tuple, object] = OrderedDict()
_drafters_lock = threading.Lock()


def prompt_lookup(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to ``k`` tokens that followed the most recent earlier occurrence of the context's last n-gram.

    Tries n from ``max_ngram`` down to ``min_ngram``; the first n with a match wins. [] if none matches."""
    length = len(tokens)
    for n in range(max_ngram, min_ngram - 1, -1):
        if length <= n:
            continue
        suffix = tokens[length - n:]
        last = suffix[-1]
        for end in range(length - 2, n - 2, -1):  # end = index of the candidate n-gram's last token
            if tokens[end] == last and tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


class NoDrafter:
    """Proposes nothing: the speculative loop becomes plain decoding (a benchmark baseline)."""

    name = "none"

    def propose(self, history: list[int], k: int, positions: RequestPositions):
        return [], None

    def rollback(self, length: int) -> None:
        pass


class PromptLookupDrafter:
    """Copies what followed an earlier occurrence of the last n-gram (Saxena 2023, "prompt lookup")."""

    name = "prompt_lookup"

    def __init__(self, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, history: list[int], k: int, positions: RequestPositions):
        return prompt_lookup(history, k, self.max_ngram, self.min_ngram), None

    def rollback(self, length: int) -> None:
        pass


class ModelDrafter:
    """A smaller model sharing the tokenizer drafts autoregressively from its processed distribution
    (the same penalties, watermark bias, temperature and truncation as the target), on its own cache."""

    name = "draft"

    def __init__(self, model: torch.nn.Module) -> None:
        self.lm = CachedLM(model)
        self.generator = torch.Generator(device="cpu").manual_seed(0)  # drafts' own draws (replay verification)

    def propose(self, history: list[int], k: int, positions: RequestPositions):
        drafts: list[int] = []
        q_rows = []
        for _ in range(k):
            logits = self.lm.logits(history + drafts, keep=1)
            dist = positions.distribution_of(logits, [list(drafts)])[0]
            if positions.params.greedy:
                token = int(dist.argmax())
            elif positions.replays:  # the stage's own choice over q; its draws never touch the request's stream
                token = positions.choice(dist, positions.rows([list(drafts)]), 0, self.generator)
            else:
                token = draw_token(dist, positions.generator)
                q_rows.append(dist)
            drafts.append(token)
        return drafts, (torch.stack(q_rows) if q_rows else None)

    def rollback(self, length: int) -> None:
        self.lm.crop_to(length)


def load_draft_model(name: str, target) -> torch.nn.Module:
    """The draft model ``name`` (a local HF folder, or "default" for the embedded model) on the target's
    device and dtype, loaded once per process; ValueError unless it shares the target's vocabulary."""
    key = (str(name), str(target.device), str(target.dtype))
    with _drafters_lock:
        loaded = _drafters.get(key)
        if loaded is None:
            loaded = load_model(name, device=target.device, dtype=target.dtype)
            _drafters[key] = loaded
            if len(_drafters) > DRAFTER_CACHE_SIZE:
                _drafters.popitem(last=False)
        else:
            _drafters.move_to_end(key)
    draft_vocab = int(loaded.model.config.vocab_size)
    target_vocab = int(target.model.config.vocab_size)
    if draft_vocab != target_vocab:
        raise ValueError(f"SpeculativeConfig.draft_model={name!r}: vocab size {draft_vocab} differs from the "
                         f"target's {target_vocab}; the drafter must share the target's tokenizer")
    if loaded.vocab.fingerprint != target.vocab.fingerprint:
        raise ValueError(f"SpeculativeConfig.draft_model={name!r}: its tokenizer differs from the target's "
                         f"(vocabulary fingerprints differ); the drafter must share the target's tokenizer")
    return loaded.model
