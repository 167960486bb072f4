"""transformers' SynthID-Text (``SynthIDTextWatermarkLogitsProcessor``), reproduced bit for bit.

How transformers (``generation/logits_process.py``) and DeepMind's ``synthid-text`` derive g-values:

* hash step (a 64-bit LCG, newlib/musl constants, wrapping int64): ``acc <- (acc + x) * M + 1``,
  M = 6364136223846793005;
* n-gram hash: acc = 1, then each of the ngram_len - 1 context tokens, then the candidate token;
* layer d: one more step with the integer key d: ``acc_d = (acc + key_d) * M + 1``;
* g_d = table[acc_d mod S] (floor modulo, so in 0..S-1), with ``table = torch.randint(0, 2, (S,),
  generator=torch.Generator("cpu").manual_seed(sampling_table_seed))``.

Generation state (transformers): the context starts as ngram_len - 1 zeros (the prompt is not used)
and shifts in each generated token; a context whose hash was among the last ``context_history_size``
context hashes is left unwatermarked. The scores are updated per layer as in
``watermark.synthid.tournament_probs``, in the logits' dtype.

Detection null: a unit's g-vector is a function of its n-gram hash alone (of ``acc mod S`` when S is
a power of two, the default), so units are deduplicated on that value, and each g-value is
Bernoulli(q) with q the table's exact fraction of ones (not exactly 1/2 for a finite table).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import lru_cache

import torch

from watermark.prf import to_signed64
from watermark.sampling_specs import HFSynthIDSpec, sampling_fingerprint
from watermark.synthid import probs_to_logits, tournament_from_bits, tournament_probs

LCG_MULTIPLIER = 6364136223846793005  # transformers' accumulate_hash default (< 2**63)
LCG_INCREMENT = 1
ALL_LAYERS_AT_ONCE = 1 << 20  # g-values held at once by a head's tournament (m x rows x candidates)


def accumulate(acc: torch.Tensor, value) -> torch.Tensor:
    """One LCG step over broadcast int64 tensors: (acc + value) * M + 1, wrapping."""
    return (acc + value) * LCG_MULTIPLIER + LCG_INCREMENT


def context_hash_value(context) -> int:
    """``HFSynthID.context_hashes`` of one context, in Python integers (a per-step check without tensors)."""
    acc = 1
    for token in context:
        acc = to_signed64((acc + int(token)) * LCG_MULTIPLIER + LCG_INCREMENT)
    return acc


@lru_cache(maxsize=8)
def sampling_table(seed: int, size: int) -> torch.Tensor:
    """transformers' table of fair bits: randint(0, 2) from a CPU generator seeded ``seed``."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(low=0, high=2, size=(size,), generator=generator)


class HFSynthID:
    """g-values, the tournament and the detection units of one ``hf:synthid`` spec (no secret)."""

    def __init__(self, spec: HFSynthIDSpec | str, vocab_size: int) -> None:
        self.spec = HFSynthIDSpec.parse(spec) if isinstance(spec, str) else spec
        if not isinstance(self.spec, HFSynthIDSpec):
            raise ValueError(f"HFSynthID needs an hf:synthid spec, got {self.spec.format()!r}")
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.key_id = None
        self.fingerprint = sampling_fingerprint(self.spec, vocab_size)
        self.batch_key = (self.spec, vocab_size)  # rows with equal keys share one tournament call
        self.table = sampling_table(self.spec.sampling_table_seed, self.spec.sampling_table_size)
        self.keys = torch.tensor([to_signed64(k) for k in self.spec.keys], dtype=torch.int64)
        size = self.spec.sampling_table_size
        self._null_g_rate = float(self.table.sum().item()) / self.table.shape[0]
        self._unit_modulus = size if size & (size - 1) == 0 else None

    def __repr__(self) -> str:
        return f"HFSynthID({self.spec.format()!r}, V={self.vocab_size})"

    @property
    def context_width(self) -> int:
        return self.spec.ngram_len - 1

    @property
    def layers(self) -> int:
        return self.spec.layers

    @property
    def null_g_rate(self) -> float:
        """P(g = 1) under H0: the table's exact fraction of ones."""
        return self._null_g_rate

    # ---- hashing --------------------------------------------------------------------------------
    def context_hashes(self, contexts: torch.Tensor) -> torch.Tensor:
        """[N, ngram_len - 1] -> [N] int64: the LCG over the context tokens from acc = 1."""
        acc = torch.ones(contexts.shape[0], dtype=torch.int64, device=contexts.device)
        for j in range(contexts.shape[1]):
            acc = accumulate(acc, contexts[:, j])
        return acc

    def layer_g(self, ngram_hashes: torch.Tensor, layer: int) -> torch.Tensor:
        """g-values of layer ``layer`` for n-gram hashes of any shape (int64 0/1, same shape)."""
        key = int(self.keys[layer])
        index = torch.remainder(accumulate(ngram_hashes, key), self.spec.sampling_table_size)
        return self.table.to(ngram_hashes.device)[index]

    def all_layers_g(self, ngram_hashes: torch.Tensor) -> torch.Tensor:
        """``layer_g`` of every layer at once: [m, *shape] int64 0/1 for n-gram hashes of any shape."""
        keys = self.keys.to(ngram_hashes.device).view(-1, *([1] * ngram_hashes.dim()))
        index = torch.remainder(accumulate(ngram_hashes.unsqueeze(0), keys), self.spec.sampling_table_size)
        return self.table.to(ngram_hashes.device)[index]

    def g_values(self, token_ids: torch.Tensor) -> torch.Tensor:
        """[B, L] token ids -> [B, L - ngram_len + 1, m]: transformers' ``compute_g_values``."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64)
        ngrams = ids.unfold(1, self.spec.ngram_len, 1)
        hashes = self.context_hashes(ngrams.reshape(-1, self.spec.ngram_len)).reshape(ngrams.shape[:2])
        return torch.stack([self.layer_g(hashes, d) for d in range(self.layers)], dim=-1)

    # ---- generation -------------------------------------------------------------------------------
    def tournament_logits(self, scores: torch.Tensor, contexts: torch.Tensor) -> torch.Tensor:
        """transformers' ``update_scores`` for scores [B, V] and contexts [B, ngram_len - 1] (the
        caller keeps transformers' state: zero-padded context, repeated-context rows left alone)."""
        context_hash = self.context_hashes(contexts.to(torch.int64)).to(scores.device)
        vocab = torch.arange(scores.shape[1], device=scores.device)
        hashes = accumulate(context_hash.unsqueeze(1), vocab.unsqueeze(0))
        probs = torch.softmax(scores, dim=1)
        layers = self.layers

        def g_layer(d: int):
            return None if d >= layers else self.layer_g(hashes, d).to(probs.dtype)

        return probs_to_logits(tournament_probs(probs, g_layer))

    def winner_distribution(self, probs: torch.Tensor, contexts: torch.Tensor,
                            candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``tournament_logits``' update from probabilities ``probs`` [B, V] (after temperature and
        truncation), or [B, C] over token ids ``candidates``: (winner probabilities [B, K], token ids
        [B, K] ascending, or None for the whole vocabulary). A truncated row plays only its live tokens:
        a token with p = 0 stays at 0 in every layer and adds nothing to a layer's mean, so the winner
        distribution is the same, m passes over K instead of V."""
        context_hash = self.context_hashes(contexts.to(torch.int64)).to(probs.device).unsqueeze(1)
        live = int((probs > 0).sum(dim=-1).max())
        if 2 * live < probs.shape[-1] or candidates is not None:
            base, at = torch.topk(probs, live, dim=-1)
            ids = at if candidates is None else candidates.gather(1, at)
            ids, order = ids.sort(dim=-1)  # token-id order: the same draw from a head or the whole row
            base = base.gather(1, order)
        else:
            base, ids = probs, None
        tokens = ids if ids is not None else torch.arange(probs.shape[-1], device=probs.device)[None]
        hashes = accumulate(context_hash, tokens)
        layers = self.layers
        if layers * base.numel() <= ALL_LAYERS_AT_ONCE:  # a head: every layer's g in one pass
            return tournament_from_bits(base, self.all_layers_g(hashes).to(base.dtype)), ids

        def g_layer(d: int):
            return None if d >= layers else self.layer_g(hashes, d).to(base.dtype)

        return tournament_probs(base, g_layer), ids

    # ---- detection ------------------------------------------------------------------------------
    def scored_positions(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """g-values [T - n + 1, m] (uint8) and each position's unit [T - n + 1, 1]: the n-gram hash
        (mod S for a power-of-two table), which alone decides the g-vector."""
        ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
        n = self.spec.ngram_len
        if ids.shape[0] < n:
            return torch.zeros((0, self.layers), dtype=torch.uint8), ids.new_zeros((0, 1))
        hashes = self.context_hashes(ids.unfold(0, n, 1))
        g = self.table[torch.remainder(accumulate(hashes.unsqueeze(1), self.keys), self.spec.sampling_table_size)]
        g = g.to(torch.uint8)  # [N, m]: every layer's ``layer_g`` in one broadcast pass
        units = hashes if self._unit_modulus is None else torch.remainder(hashes, self._unit_modulus)
        return g, units.unsqueeze(1)


class HFSynthIDState:
    """transformers' per-batch processor state, for reproducing ``model.generate(watermarking_config=...)``:
    the context starts as zeros and shifts in each generated token; a context whose hash is among the
    last ``context_history_size`` context hashes is left unwatermarked."""

    def __init__(self, synthid: HFSynthID, batch_size: int) -> None:
        self.synthid = synthid
        self.context = torch.zeros((batch_size, synthid.context_width), dtype=torch.int64)
        self.history = torch.zeros((batch_size, synthid.spec.context_history_size), dtype=torch.int64)
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """One step, as ``SynthIDTextWatermarkLogitsProcessor.__call__``."""
        if self.calls:
            self.context = torch.cat([self.context, input_ids[:, -1:].cpu()], dim=1)[:, 1:]
        self.calls += 1
        if self.synthid.spec.skip_first_ngram_calls and self.calls < self.synthid.spec.ngram_len:
            return scores
        updated = self.synthid.tournament_logits(scores, self.context)
        context_hash = self.synthid.context_hashes(self.context).unsqueeze(1)
        repeated = (self.history == context_hash).any(dim=1, keepdim=True)
        self.history = torch.cat([context_hash, self.history], dim=1)[:, :-1]
        return torch.where(repeated.to(scores.device), scores, updated)


def fresh_context_mask(synthid: HFSynthID, token_ids: torch.Tensor) -> torch.Tensor:
    """transformers' ``compute_context_repetition_mask`` for one sequence [L] -> bool [L - n + 1]:
    False where the position's context hash is among the previous ``context_history_size`` context
    hashes (a window that starts full of zeros, as transformers' state does)."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    width, size = synthid.context_width, synthid.spec.context_history_size
    if ids.shape[0] <= width:
        return torch.zeros(0, dtype=torch.bool)
    hashes = synthid.context_hashes(ids[:-1].unfold(0, width, 1)).tolist()
    window = [0] * size  # oldest first
    counts = {0: size}
    fresh = []
    for index, value in enumerate(hashes):
        fresh.append(counts.get(value, 0) == 0)
        oldest = window[index]
        counts[oldest] -= 1
        window.append(value)
        counts[value] = counts.get(value, 0) + 1
    return torch.tensor(fresh, dtype=torch.bool)


def before_eos_mask(synthid: HFSynthID, token_ids: torch.Tensor, eos_token_id: int | None) -> torch.Tensor:
    """transformers' ``compute_eos_token_mask`` sliced as its detector does: bool [L - n + 1], False from
    the first EOS on."""
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    mask = torch.ones(ids.shape[0], dtype=torch.bool)
    if eos_token_id is not None:
        hits = torch.nonzero(ids == eos_token_id)
        if hits.shape[0]:
            mask[int(hits[0, 0]):] = False
    return mask[synthid.context_width:]


class HFContextWindow:
    """transformers' SynthID processor state for one sequence, replayed from its generated tokens."""

    __slots__ = ("mark", "start", "absorbed", "window", "counts")

    def __init__(self, mark: HFSynthID, prompt_len: int) -> None:
        self.mark = mark
        self.start = prompt_len
        self.absorbed = 0  # generated steps whose context hash went through the window
        size = mark.spec.context_history_size
        self.window: deque[int] = deque([0] * size)  # oldest first; transformers' history starts as zeros
        self.counts: dict[int, int] = {0: size}

    def context(self, history: Sequence[int], step: int) -> list[int]:
        """The context of generated step ``step``: the ``ngram_len - 1`` generated tokens before it, zeros first."""
        width = self.mark.context_width
        generated = history[self.start + max(0, step - width):self.start + step]
        return [0] * (width - len(generated)) + [int(t) for t in generated]

    def _skipped(self, step: int) -> bool:
        # transformers' skip_first_ngram_calls: the first ngram_len - 1 calls return the scores as they are
        return self.mark.spec.skip_first_ngram_calls and step < self.mark.context_width

    def _push(self, value: int) -> None:
        oldest = self.window.popleft()
        self.counts[oldest] -= 1
        self.window.append(value)
        self.counts[value] = self.counts.get(value, 0) + 1

    def step(self, history: Sequence[int]) -> tuple[list[int], bool]:
        """(context, watermarked?) for the position after ``history`` (the committed tokens)."""
        now = len(history) - self.start
        for step in range(self.absorbed, now):
            if not self._skipped(step):
                self._push(context_hash_value(self.context(history, step)))
        self.absorbed = max(self.absorbed, now)
        context = self.context(history, now)
        if self._skipped(now):
            return context, False
        return context, self.counts.get(context_hash_value(context), 0) == 0
