"""Prefill without padding: on the native kernels, prompts of different lengths run as their own tokens only.

A padded prefill runs every prompt of a group at the longest one's length (up to PREFILL_PADDING_SLACK more
rows through every linear). The native view computes each prompt token as one row at its own position
(the rows a chunked prefill already uses), so a step's linears see exactly the prompts' tokens, whatever
their lengths, and the logits are each prompt's own, as a forward of that prompt alone gives them.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from generation.cpu import native
from generation.cpu.packed_linear import packing_available
from generation.engine import Engine
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner
from generation.sample.sampler import SamplingParams

if not native.available(torch.float32, torch.device("cpu")):
    pytest.skip("no C++ compiler: the native kernels are not built", allow_module_level=True)

TINY = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 256,
        "tie_word_embeddings": True}


def rows_through_the_mlp(runner: ModelRunner) -> list[int]:
    """Record the rows each call of the first layer's down projection computes (the module path's linears)."""
    seen: list[int] = []
    down = runner.decoder.layers[0].mlp.down_proj
    forward = down.forward

    def counted(x):
        seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return forward(x)

    down.forward = counted
    return seen


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16))
def test_prompts_of_different_lengths_run_their_tokens_and_no_padding(dtype):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).to(dtype).eval()
    if not packing_available(model):
        pytest.skip(f"oneDNN has no packed {dtype} linear on this CPU")
    runner = ModelRunner(model, CacheConfig(num_blocks=64, max_model_len=256), native_kernels=True)
    gen = torch.Generator().manual_seed(5)
    lengths = [90, 61, 17, 3, 1]  # 172 tokens; padded to the longest they would be 450 rows
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    free = list(range(64))
    tables = [[free.pop() for _ in range(-(-(n + 1) // 16))] for n in lengths]
    seen = rows_through_the_mlp(runner)
    got = runner.prefill(prompts, [0] * len(prompts), tables)
    assert seen == [sum(lengths)]
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            want = model(torch.tensor([prompt])).logits[0, -1].float()
            torch.testing.assert_close(got[row], want, rtol=tol, atol=tol)
    # the keys written are each prompt's own: one more token per row decodes as the full forward does
    nxt = torch.randint(0, TINY["vocab_size"], (len(lengths),), generator=gen)
    after = runner.decode(nxt, lengths, tables)
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            want = model(torch.tensor([prompt + [int(nxt[row])]])).logits[0, -1].float()
            torch.testing.assert_close(after[row], want, rtol=tol, atol=tol)


def test_a_prompt_after_its_cached_prefix_runs_only_its_new_tokens():
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    if not packing_available(model):
        pytest.skip("oneDNN has no packed float32 linear on this CPU")
    runner = ModelRunner(model, CacheConfig(num_blocks=64, max_model_len=256), native_kernels=True)
    gen = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, TINY["vocab_size"], (120,), generator=gen).tolist()
    other = torch.randint(0, TINY["vocab_size"], (70,), generator=gen).tolist()
    tables = [list(range(0, 8)), list(range(8, 13))]
    runner.prefill([prompt[:48]], [0], tables[:1])  # three full blocks cached
    seen = rows_through_the_mlp(runner)
    got = runner.prefill([prompt[48:], other], [48, 0], tables)
    assert seen == [72 + 70]
    with torch.inference_mode():
        for row, ids in enumerate((prompt, other)):
            want = model(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-4)


def test_the_engine_prefills_a_burst_of_lengths_in_one_pass_of_their_tokens(loaded):
    engine = Engine(loaded, max_num_seqs=8, max_model_len=512)
    if not engine.runner.flat_prefill:
        pytest.skip("this machine runs the padded prefill (no native kernels)")
    tok = loaded.vocab.tokenizer
    texts = ["Tell me about the tides of the northern sea and the moon. " * 6, "Hello", "def add(a, b):",
             "A short story about a fox who learns to read, in three paragraphs, please."]
    prompts = [tok(t)["input_ids"] for t in texts]
    calls = []
    prefill = engine.runner.prefill

    def spied(ps, starts, tables):
        calls.append([len(p) for p in ps])
        return prefill(ps, starts, tables)

    engine.runner.prefill = spied
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    outs = engine.generate(prompts, params, use_tqdm=False)
    assert len(calls) == 1 and sorted(calls[0]) == sorted(len(p) for p in prompts)
    with torch.inference_mode():
        for prompt, out in zip(prompts, outs):
            x = torch.tensor([prompt])
            want = loaded.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False)
            assert out.token_ids == want[0, len(prompt):].tolist()
