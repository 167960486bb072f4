"""provmark's keyed watermark as a vLLM (V1 engine) logits processor. Needs the ``[vllm]`` extra.

Load it by name::

    LLM(model, logits_processors=["generation.vllm.plugin:ProvmarkWatermarkLogitsProcessor"])
    vllm serve MODEL --logits-processors generation.vllm.plugin:ProvmarkWatermarkLogitsProcessor

Per request, through ``SamplingParams(extra_args={...})`` (``vllm_xargs`` in the OpenAI server):

* ``provmark_watermark``: a spec string (``kgw:...``, ``hf:...``, or a sampling spec ``gumbel:...``,
  ``synthid:...``, ``hf:synthid,...``); absent, None or True -> the default spec; ``"off"`` (the name
  the HTTP APIs use) or False -> this request is not watermarked.
* ``provmark_key_id``: a keyring key id (active or standby); absent -> the keyring's active key. A sampling
  spec needs a key bound to it (``provmark keys create --watermark gumbel:h=4``).

So an engine built with the plugin watermarks every request by default, like provmark's own
generation service: opting out is explicit. Keys come from the keyring of the process's
environment (``PROVMARK_HOME``, ``PROVMARK_MASTER_KEY``), which vLLM's workers inherit; a request
naming an unknown or retired key, or arriving while the keyring has no active key, is rejected
at admission (``validate_params``, HTTP 400 in the server).

vLLM applies the plugin to raw logits (after its allowed-token mask, bad words, min_tokens and
logit_bias; before penalties, temperature and truncation: ``vllm/v1/sample/sampler.py``).

* kgw/hf specs: the bias reads the same token history (prompt and output ids) with the same PRF as
  provmark's engine, so ``provmark detect`` scores the text exactly as text from ``provmark generate``;
  the green lists, hence detection, do not depend on the order. The bias runs on the engine's C++ kernel
  (``generation/cpu/native.py``) when it builds, as in our engine.
* sampling specs (``sampling_rows.py``): the plugin computes the row's distribution as our engine does
  (temperature, top-k, top-p, min-p from the request's SamplingParams), lets our keyed race or
  tournament choose, and sets every other logit to -inf, so vLLM's own draw returns that token. What
  vLLM would apply afterwards and that changes the distribution (repetition/presence/frequency
  penalties) is refused at admission, as are greedy requests (the sampler IS the watermark), a key
  bound to another spec, and ``vllm:gumbel`` (use vLLM's own ``--watermark-config``).
"""

from __future__ import annotations

import logging

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    LogitsProcessor,
    MoveDirectionality,
)

from generation.vllm.rows import RequestWatermarks, WatermarkedBatch, WatermarkRequest, use_native_kernels
from generation.vllm.sampling_rows import check_sampling_request, our_params
from watermark.key_binding import require_bound
from watermark.key_info import KeyringError
from watermark.keys import Keyring

log = logging.getLogger(__name__)

PLUGIN_FQCN = "generation.vllm.plugin:ProvmarkWatermarkLogitsProcessor"  # what LLM()/--logits-processors take


class ProvmarkWatermarkLogitsProcessor(LogitsProcessor):
    """Biases each request's logits with its keyed watermark, or (sampling specs) leaves only the keyed
    sampler's token; rows without a watermark are left untouched."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Reject at admission a bad spec or key id, an unknown or retired key, a missing active key, and a
        sampling spec the plugin cannot apply exactly (greedy, penalties), and any spec whose colours differ
        from its key's own (a kgw ``h=1`` request under an ``h=4`` key would let the caller read the key's
        colours from the text, docs/security.md)."""
        request = WatermarkRequest.from_extra_args(sampling_params.extra_args)
        if request.spec is None:
            return
        info = None
        if request.spec.needs_key:
            try:
                info = _usable_key(Keyring(), request.key_id)
            except KeyringError as exc:
                raise ValueError(f"provmark keyring: {exc}") from None
        check_sampling_request(request.spec, sampling_params, info)
        if info is not None:  # kgw too: a key writes only its own colours (watermark.key_binding)
            require_bound(info, request.spec)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        vocab_size = int(vllm_config.model_config.get_vocab_size())
        if device.type == "cpu":  # this runs in the worker process: the backends are per process
            use_native_kernels()
        self.batch = WatermarkedBatch(RequestWatermarks(vocab_size), on_error=_unresolved)

    def is_argmax_invariant(self) -> bool:
        """The bias moves green logits up (or red ones to -inf), so greedy choices change."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not batch_update:
            return
        self.batch.update(
            batch_update.removed,
            [(index, params.extra_args, prompt_ids, output_ids, _our_params(params))
             for index, params, prompt_ids, output_ids in batch_update.added],
            [(a, b, direction == MoveDirectionality.SWAP) for a, b, direction in batch_update.moved],
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return self.batch.apply(logits)


def _usable_key(keyring: Keyring, key_id: str | None):
    """The KeyInfo a request's watermark would use: the named key, or the active one."""
    if key_id is None:
        return keyring.active()
    info = next((k for k in keyring.list() if k.key_id == key_id), None)
    if info is None or not info.usable_for_generation:
        state = "unknown" if info is None else info.status
        raise ValueError(f"provmark_key_id: key {key_id!r} cannot be used for generation ({state})")
    return info


def _our_params(params: SamplingParams):
    """Our SamplingParams of a request, for sampling specs; None when they do not convert (then a sampling
    spec's row stays unwatermarked and logged: admission refuses such requests first)."""
    try:
        return our_params(params)
    except ValueError:
        return None


def _unresolved(index: int, exc: Exception) -> None:
    # admission checked the key; it was retired or the keyring changed since: keep the engine serving
    log.error("provmark: batch row %d left unwatermarked: %s", index, exc)
