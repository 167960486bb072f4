"""The vLLM plugin's fast paths against their plain definitions on seeded random inputs: the SynthID
tournament from precomputed layer bits (hf:synthid's heads) against ``tournament_probs`` (bit for bit), and the plugin's
chosen tokens with the C++ top-k heads against torch.topk's (float32 rows, and bfloat16-rounded rows whose
heads tie, the kernel's fallback), in the everything-sampled batch and a mixed one."""

import pytest
import torch

from generation.cpu import native
from generation.sample import top_head as top_head_module
from generation.sample.params import SamplingParams
from generation.vllm.rows import KEY_ID_ARG, WATERMARK_ARG, RequestWatermarks, WatermarkedBatch
from watermark.synthid import tournament_from_bits, tournament_probs

V = 49152
SPECS = ("gumbel:h=4", "synthid:h=4")
SAMPLED = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(5))
def test_tournament_from_bits_equals_tournament_probs(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    rows, width, layers = 16, (40, 66, 300, 7, 1)[seed], (30, 1, 12, 64, 30)[seed]
    probs = torch.rand(rows, width, generator=gen, dtype=torch.float64).pow(4).to(dtype)
    probs[:, 1::5] = 0  # truncated tokens
    probs = probs / probs.sum(-1, keepdim=True)
    words = torch.randint(-2**63, 2**63 - 1, (rows, width), generator=gen, dtype=torch.int64)
    plain = tournament_probs(probs, lambda d: None if d >= layers else ((words >> d) & 1).to(dtype))
    bits = torch.stack([((words >> d) & 1).to(dtype) for d in range(layers)])
    assert torch.equal(tournament_from_bits(probs, bits), plain)


def _chosen_tokens(keyring, keys, backend, bf16: bool, mixed: bool, steps: int = 12) -> list[list[int]]:
    """Each step's forced token per sampling row (-1 for rows the plugin leaves to vLLM)."""
    top_head_module.set_top_head_backend(backend)
    try:
        extras = [{WATERMARK_ARG: spec, KEY_ID_ARG: keys[spec]} for spec in SPECS for _ in range(4)]
        if mixed:
            extras[2], extras[5] = None, {WATERMARK_ARG: "off"}  # a kgw row and an unwatermarked one
        gen = torch.Generator().manual_seed(11)
        prompts = torch.randint(100, V, (len(extras), 6), generator=gen).tolist()
        outputs: list[list[int]] = [[] for _ in extras]
        settings = [SAMPLED, {**SAMPLED, "top_k": 20}, {"temperature": 1.0, "top_k": 40, "min_p": 0.05}, SAMPLED]
        batch = WatermarkedBatch(RequestWatermarks(V, keyring))
        batch.update([], [(i, extras[i], prompts[i], outputs[i], SamplingParams(seed=i, **settings[i % 4]))
                          for i in range(len(extras))], [])
        chosen = []
        for step in range(steps):
            logits = torch.randn(len(extras), V, generator=gen) * 4
            if bf16:
                logits = logits.to(torch.bfloat16).to(torch.float32)  # heads full of ties
            forced = batch.apply(logits)
            finite = torch.isfinite(forced)
            row_tokens = [int(f.int().argmax()) if int(f.sum()) == 1 else -1 for f in finite]
            chosen.append(row_tokens)
            for out, token in zip(outputs, row_tokens):
                out.append(token if token >= 0 else step + 100)
        return chosen
    finally:
        top_head_module.set_top_head_backend(None)


@pytest.mark.skipif(not native.available(torch.float32, torch.device("cpu")), reason="no C++ compiler")
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("mixed", [False, True])
def test_plugin_tokens_with_the_kernel_heads_equal_torch_topk(keyring, bf16, mixed):
    keys = {spec: keyring.create(f"k-{spec.split(':')[0]}", spec=spec).key_id for spec in SPECS}
    fast = _chosen_tokens(keyring, keys, native.top_head, bf16, mixed)
    assert fast == _chosen_tokens(keyring, keys, None, bf16, mixed)
    sampled = [row for row in range(len(fast[0])) if not (mixed and row in (2, 5))]
    assert all(step[row] >= 0 for step in fast for row in sampled)
