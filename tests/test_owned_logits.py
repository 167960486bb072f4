"""The engine hands each step's logits to the sampler, which then works on them in place (no [B, V] copy).

``LogitsPipeline.sample(..., owned=True)`` may modify the float32 logits it is given; without ``owned`` they
are left untouched (beam search, best_of and the vLLM plugin rely on that). The runner's LM head returns
ordinary tensors (``ModelRunner.head``), since torch refuses in-place writes to inference tensors outside
inference mode; inference tensors handed over as owned are still copied, never refused.
"""

from __future__ import annotations

import torch

from generation.sample import LogitsPipeline, StepRows
from generation.sample.sampler import SamplerState, SamplingParams

VOCAB = 64


def _rows(n: int, **params) -> StepRows:
    return StepRows.of([SamplerState(SamplingParams(temperature=0.0, **params), [1, 2, 3], {0}) for _ in range(n)])


def test_owned_logits_are_worked_on_in_place_and_give_the_same_tokens():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=gen)
    pipeline = LogitsPipeline(VOCAB, "cpu")
    ban = {int(logits[0].argmax()): -100.0}  # a logit_bias the penalise stage writes into the scores

    kept = logits.clone()
    copied = pipeline.sample(kept, _rows(3, logit_bias=ban))
    assert torch.equal(kept, logits)  # not owned: untouched

    owned = logits.clone()
    in_place = pipeline.sample(owned, _rows(3, logit_bias=ban), owned=True)
    assert torch.equal(in_place.token_ids, copied.token_ids)
    assert not torch.equal(owned, logits)  # the bias went into the caller's tensor: no copy was made


def test_owned_inference_tensors_and_bf16_are_copied_not_refused():
    pipeline = LogitsPipeline(VOCAB, "cpu")
    with torch.inference_mode():
        frozen = torch.randn(2, VOCAB)
    out = pipeline.sample(frozen, _rows(2, logit_bias={5: 50.0}), owned=True)
    assert out.token_ids.tolist() == [5, 5]
    half = torch.randn(2, VOCAB).to(torch.bfloat16)
    before = half.clone()
    out = pipeline.sample(half, _rows(2, logit_bias={7: 50.0}), owned=True)
    assert out.token_ids.tolist() == [7, 7] and torch.equal(half, before)


def test_runner_head_returns_ordinary_float32_tensors():
    from transformers import LlamaConfig, LlamaForCausalLM

    from generation.kv_cache import CacheConfig
    from generation.runner import ModelRunner

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    runner = ModelRunner(LlamaForCausalLM(config).eval(), CacheConfig(8, 64))
    logits = runner.prefill([[1, 2, 3, 4]], [0], [[0]])
    assert logits.dtype == torch.float32 and logits.shape == (1, VOCAB)
    assert not logits.is_inference()
    step = runner.decode(torch.tensor([5]), [4], [[0]])
    assert not step.is_inference()
    step.add_(1.0)  # allowed outside inference mode: what the sampler's in-place stages do
