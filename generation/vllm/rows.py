"""The vLLM plugin's logic without vLLM: which watermark each request asks for, and per-row state
of a persistent batch whose rows are added, removed and moved between steps.

vLLM's model (``vllm.v1.sample.logits_processor.BatchUpdate``): before each step the processor is
told which batch indices were removed, which were (re)filled with a new request
``(index, params, prompt_ids, output_ids)`` and which moved (``a -> b`` or ``a <-> b``), in that
order. ``output_ids`` is the request's live output list, kept by reference so every step sees the
newest tokens without copying. Everything here takes plain values so it is tested without vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from generation.cpu import native
from generation.sample.params import SamplingParams
from generation.sample.sampling_stage import check_spec
from generation.sample.top_head import set_top_head_backend
from generation.sample.watermark_stage import KGWBiasStage
from generation.vllm.sampling_rows import SamplingChoices, SamplingRow
from watermark.config import SpecError, WatermarkSpec
from watermark.greenlist import set_bias_backend
from watermark.gumbel import set_survivors_backend
from watermark.key_info import KeyringError, validate_key_id
from watermark.keys import Keyring
from watermark.scheme import Watermark, generation_watermark
from watermark.specs import AnySpec, is_sampling, parse_spec
from watermark.synthid import set_tournament_backend

# SamplingParams.extra_args names (also what vLLM's OpenAI server takes as `vllm_xargs`).
WATERMARK_ARG = "provmark_watermark"  # a spec string; absent/None/True -> the default spec; False/"off" -> none
KEY_ID_ARG = "provmark_key_id"  # a keyring key id; absent/None -> the keyring's active key
OFF_VALUES = ("off", "none")  # string forms of False: `vllm_xargs` carries only str/int/float
MAX_CACHED_WATERMARKS = 64  # specs are client-chosen: bound what they can make a worker keep


def use_native_kernels() -> bool:
    """Route the KGW bias and the Gumbel race's pruning to the engine's C++ kernels, as our engine does
    (``generation/engine.py``): the same integers in one pass, without torch.compile's per-call overhead
    (which was most of the plugin's cost). Process-wide; False (the tensor code stays) without a compiler."""
    if not native.available(torch.float32, torch.device("cpu")):
        return False
    set_bias_backend(native.watermark_bias)  # both take only CPU float32 and decline anything else
    set_survivors_backend(native.gumbel_survivors)
    set_top_head_backend(native.top_head)  # the top-k heads of sampled rows (sampling watermarks)
    set_tournament_backend(native.synthid_tournament)  # SynthID's layers over a head, same bits
    return True


@dataclass(frozen=True, slots=True)
class WatermarkRequest:
    """What one request asks for: ``spec`` None means unwatermarked."""

    spec: AnySpec | None
    key_id: str | None

    @classmethod
    def from_extra_args(cls, extra_args: Mapping | None) -> WatermarkRequest:
        """Parse ``SamplingParams.extra_args``; ValueError naming the bad field (never echoing a key id)."""
        extra_args = extra_args or {}
        if not isinstance(extra_args, Mapping):
            raise ValueError("extra_args: expected a mapping")  # noqa: TRY004 - vLLM turns ValueError into HTTP 400
        raw_spec = extra_args.get(WATERMARK_ARG)
        key_id = extra_args.get(KEY_ID_ARG)
        if key_id is not None:
            validate_key_id(key_id)  # its error does not echo the value (it may be a pasted secret)
        if raw_spec is False or (isinstance(raw_spec, str) and raw_spec.strip().lower() in OFF_VALUES):
            if key_id is not None:
                raise ValueError(f"{KEY_ID_ARG}: nothing to key: {WATERMARK_ARG} turns the watermark off")
            return cls(None, None)
        if raw_spec is None or raw_spec is True:
            spec = WatermarkSpec.default()
        elif isinstance(raw_spec, str):
            try:
                spec = parse_spec(raw_spec)  # kgw:/hf: bias specs and the gumbel:/synthid: sampling specs
            except SpecError as exc:
                raise ValueError(f"{WATERMARK_ARG}: {exc}") from None
        else:
            raise ValueError(f"{WATERMARK_ARG}: expected a spec string, true or false, "
                             f"got {type(raw_spec).__name__}")
        if not spec.needs_key and key_id is not None:
            raise ValueError(f"{KEY_ID_ARG}: hf specs carry their own hashing_key; do not name a keyring key")
        return cls(spec, key_id)


class RequestWatermarks:
    """Requests -> Watermark objects, cached per (spec, key id) until the keyring file changes.

    The keyring is read with the process's own environment (``PROVMARK_HOME``,
    ``PROVMARK_MASTER_KEY``): vLLM's workers inherit it from the process that built the engine."""

    def __init__(self, vocab_size: int, keyring: Keyring | None = None) -> None:
        if not isinstance(vocab_size, int) or vocab_size <= 1:
            raise ValueError(f"vocab_size: expected an integer > 1, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self._keyring = keyring
        self._cache: dict[WatermarkRequest, Watermark] = {}
        self._keyring_stamp: tuple | None = None

    @property
    def keyring(self) -> Keyring:
        if self._keyring is None:
            self._keyring = Keyring()
        return self._keyring

    def resolve(self, request: WatermarkRequest) -> Watermark | None:
        """The request's Watermark (None when it is unwatermarked).

        Raises ``watermark.key_info.KeyringError`` (unknown, retired or missing key; no master key)."""
        if request.spec is None:
            return None
        if request.spec.needs_key:
            self._forget_if_keyring_changed()
        found = self._cache.get(request)
        if found is None:
            found = generation_watermark(request.spec, self.vocab_size, key_id=request.key_id,
                                         keyring=self.keyring if request.spec.needs_key else None)
            if len(self._cache) >= MAX_CACHED_WATERMARKS:
                self._cache.clear()
            self._cache[request] = found
        return found

    def _forget_if_keyring_changed(self) -> None:
        # a rotation changes which key "active" means; a retirement makes a key unusable
        try:
            info = os.stat(self.keyring.path)
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._keyring_stamp:
            self._cache.clear()
            self._keyring_stamp = stamp


@dataclass(slots=True)
class _Row:
    watermark: Watermark
    prompt_tail: list[int]  # the prompt's last context-width tokens: all the bias can ever read of it
    output_ids: Sequence[int]  # the engine's live list, by reference
    sampling: SamplingRow | None = None  # set for a sampling spec: the row's token is chosen, not biased


class WatermarkedBatch:
    """Per-batch-index watermarks and histories; ``apply`` biases a step's logits like our engine does."""

    def __init__(self, requests: RequestWatermarks, on_error=None) -> None:
        self.requests = requests
        self._rows: dict[int, _Row] = {}
        self._stage = KGWBiasStage()  # the engine's LogitsPipeline watermark stage (vLLM draws the token itself)
        self._choices = SamplingChoices(requests.vocab_size)  # sampling specs: our stages 6-8 choose the token
        self._on_error = on_error  # called with (batch index, exception) when a request's key cannot be resolved

    def __len__(self) -> int:
        return len(self._rows)

    def watermark_at(self, index: int) -> Watermark | None:
        row = self._rows.get(index)
        return None if row is None else row.watermark

    def update(self, removed: Iterable[int], added: Iterable[tuple], moved: Iterable[tuple]) -> None:
        """One step's batch changes, processed in vLLM's order: removed, added, moved.

        ``added``: ``(index, extra_args, prompt_ids or None, output_ids[, params])``, ``params`` our
        ``SamplingParams`` of the request (``sampling_rows.our_params``; needed by sampling specs);
        ``moved``: ``(a, b, swap)`` where ``swap`` False moves a to b and empties a."""
        for index in removed:
            self._rows.pop(index, None)
        for index, extra_args, prompt_ids, output_ids, *params in added:
            row = self._make_row(index, extra_args, prompt_ids, output_ids, params[0] if params else None)
            if row is None:
                self._rows.pop(index, None)
            else:
                self._rows[index] = row
        for a, b, swap in moved:
            row_a, row_b = self._rows.pop(a, None), self._rows.pop(b, None)
            if row_a is not None:
                self._rows[b] = row_a
            if swap and row_b is not None:
                self._rows[a] = row_b

    def _make_row(self, index: int, extra_args, prompt_ids, output_ids,
                  params: SamplingParams | None) -> _Row | None:
        try:
            watermark = self.requests.resolve(WatermarkRequest.from_extra_args(extra_args))
            if watermark is not None and is_sampling(watermark.spec):
                if params is None:
                    raise ValueError(f"{watermark.spec.kind}: a sampling watermark needs the request's sampling "
                                     "parameters")
                check_spec(watermark.spec, params)  # admission refused these; a worker never samples them
        except (KeyringError, ValueError) as exc:
            if self._on_error is None:
                raise
            self._on_error(index, exc)
            return None
        if watermark is None:
            return None
        width = max(watermark.context_width, 1)
        prompt = list(prompt_ids or ())
        tail = prompt[len(prompt) - width:] if len(prompt) > width else prompt
        if not is_sampling(watermark.spec):
            return _Row(watermark, tail, output_ids)
        return _Row(watermark, tail, output_ids, SamplingRow.of(watermark, params, tail, len(prompt), output_ids))

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Bias ``logits`` [B, >= V] in place (row i by the request at batch index i) and return it."""
        if not self._rows:
            return logits
        batch = logits.shape[0]
        marks: list[Watermark | None] = [None] * batch
        histories: list[Sequence[int]] = [()] * batch
        chosen: list[tuple[int, SamplingRow]] = []
        for index, row in self._rows.items():
            if index >= batch:
                continue
            if row.sampling is not None:
                chosen.append((index, row.sampling))
                continue
            marks[index] = row.watermark
            histories[index] = _history_tail(row, max(row.watermark.context_width, 1))
        if any(mark is not None for mark in marks):
            vocab = self.requests.vocab_size
            view = logits if logits.shape[1] == vocab else logits[:, :vocab]  # padded vocabularies
            self._stage.transform_(view, histories, marks)
        self._choices.apply_(logits, sorted(chosen, key=lambda item: item[0]))
        return logits


def _history_tail(row: _Row, width: int) -> list[int]:
    """The last ``width`` tokens of prompt + output (fewer when the request has fewer)."""
    output = row.output_ids
    if len(output) >= width:
        return list(output[len(output) - width:])
    need = width - len(output)
    return row.prompt_tail[max(len(row.prompt_tail) - need, 0):] + list(output)
