"""The plugin's sampling watermarks (``gumbel:``, ``synthid:``, ``hf:synthid``): the keyed sampler chooses the token.

vLLM 0.32 applies a non-argmax-invariant logits processor to the raw logits, after its allowed-token mask,
bad words, min_tokens and logit_bias and before penalties, temperature, min-p, top-k and top-p
(``vllm/v1/sample/sampler.py``: ``apply_logits_processors`` then ``sample``). So for a row under a sampling
spec the plugin runs our engine's stages 6-8 itself (``LogitsPipeline.choose``: temperature, top-k, top-p,
min-p, then the keyed race or tournament, or the plain draw where the watermark sits a position out) and
leaves only the chosen token finite: whatever vLLM does afterwards (temperature, truncation, its draw)
keeps that token. What vLLM would apply after the plugin and that changes the distribution (penalties)
is refused at admission rather than watermarked wrongly, as greedy requests are (the sampler IS the
watermark). Everything here takes plain values, so it is tested without vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from generation.sample.params import SamplerState, SamplingParams
from generation.sample.pipeline import LogitsPipeline, StepRows
from generation.sample.sampling_stage import check_spec
from watermark.key_binding import require_bound
from watermark.schemes import family_of, is_sampling

NEG_INF = float("-inf")
# vLLM options applied after the plugin that change the distribution: (attribute, neutral value)
AFTER_PLUGIN = (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0))


def our_params(vllm_params) -> SamplingParams:
    """Our SamplingParams for what decides a row's distribution after the plugin (temperature, top-k, top-p,
    min-p) and its own randomness (seed) in vLLM's ``SamplingParams`` (read by attribute)."""
    top_k = int(getattr(vllm_params, "top_k", 0) or 0)
    seed = getattr(vllm_params, "seed", None)
    return SamplingParams(temperature=float(getattr(vllm_params, "temperature", 1.0)), top_k=max(top_k, 0),
                          top_p=float(getattr(vllm_params, "top_p", 1.0)),
                          min_p=float(getattr(vllm_params, "min_p", 0.0)),
                          seed=None if seed is None else int(seed) % 2**64)


def check_sampling_request(spec, vllm_params, key_info=None) -> None:
    """ValueError unless a request under a sampling ``spec`` can be watermarked exactly: not greedy, not
    ``vllm:gumbel`` (detection only), no penalties (vLLM applies them after the plugin), and a keyring key
    (``key_info``, when given) bound to this spec. Nothing for other specs."""
    if not is_sampling(spec):
        return
    name = family_of(spec).name
    for field, neutral in AFTER_PLUGIN:
        value = getattr(vllm_params, field, neutral)
        if value is not None and float(value) != neutral:
            raise ValueError(f"{name}: {field}={value} is not supported with a sampling watermark in vLLM "
                             f"(vLLM applies it after the watermark chooses the token); leave it at {neutral}")
    check_spec(spec, our_params(vllm_params))  # greedy, vllm:gumbel: a SamplingWatermarkError (a ValueError)
    if key_info is not None:
        require_bound(key_info, spec)


class LiveHistory(Sequence):
    """A request's token history (prompt + output) read through vLLM's live output list: only the prompt's
    last ``len(prompt_tail)`` tokens are kept (all a sampling watermark's context and memory read of it)."""

    __slots__ = ("prompt_tail", "prompt_len", "output")

    def __init__(self, prompt_tail: list[int], prompt_len: int, output: Sequence[int]) -> None:
        self.prompt_tail = prompt_tail
        self.prompt_len = prompt_len
        self.output = output

    def __len__(self) -> int:
        return self.prompt_len + len(self.output)

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            if start >= stop:
                return []
            cut = self.prompt_len
            if start >= cut:  # the usual read (a context, a dedup check): output tokens only
                return list(map(int, self.output[start - cut:stop - cut]))
            head = [self._prompt(i) for i in range(start, min(stop, cut))]
            return head + [int(t) for t in self.output[max(start - cut, 0):max(stop - cut, 0)]]
        index = key + len(self) if key < 0 else key
        if not 0 <= index < len(self):
            raise IndexError("history index out of range")
        return self._prompt(index) if index < self.prompt_len else int(self.output[index - self.prompt_len])

    def _prompt(self, index: int) -> int:
        at = index - (self.prompt_len - len(self.prompt_tail))
        if at < 0:
            raise IndexError(f"prompt position {index} is older than the kept tail")
        return self.prompt_tail[at]


@dataclass(slots=True)
class SamplingRow:
    """One request under a sampling watermark: its watermark and our sampler state over its live history."""

    watermark: object
    state: SamplerState

    @classmethod
    def of(cls, watermark, params: SamplingParams, prompt_tail: list[int], prompt_len: int,
           output_ids: Sequence[int]) -> SamplingRow:
        state = SamplerState(params, [], set())  # its own generator: seeded by the request's seed, else fresh
        state.history = LiveHistory(prompt_tail, prompt_len, output_ids)
        state.prompt_len = prompt_len
        return cls(watermark, state)


class SamplingChoices:
    """Forces each sampling row of a step's logits to the token our engine's stages 6-8 choose."""

    def __init__(self, vocab_size: int) -> None:
        self.pipeline = LogitsPipeline(vocab_size, "cpu")

    def apply_(self, logits: torch.Tensor, rows: Sequence[tuple[int, SamplingRow]]) -> None:
        """``logits`` [B, >= V] in place: each listed batch row keeps only its chosen token (logit 0)."""
        if not rows:
            return
        vocab = self.pipeline.vocab_size  # padded columns past it are forced to -inf too
        step = StepRows.of([row.state for _, row in rows], [row.watermark for _, row in rows])
        if [i for i, _ in rows] == list(range(logits.shape[0])):  # every row sampled: no [B, V] copies
            scores = logits if logits.shape[1] == vocab and logits.dtype == torch.float32 else \
                logits[:, :vocab].to(torch.float32).contiguous()
            tokens = self.pipeline.choose(scores, step)  # may scale ``logits`` in place: all overwritten below
            logits.fill_(NEG_INF).scatter_(1, tokens[:, None].to(logits.device), 0.0)
            return
        index = torch.tensor([i for i, _ in rows], dtype=torch.long, device=logits.device)
        scores = logits.index_select(0, index)[:, :vocab].to(torch.float32).contiguous()
        tokens = self.pipeline.choose(scores, step)
        forced = torch.full((len(rows), logits.shape[1]), NEG_INF, dtype=logits.dtype, device=logits.device)
        forced.scatter_(1, tokens[:, None].to(logits.device), 0.0)
        logits.index_copy_(0, index, forced)
