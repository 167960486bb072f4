"""Packed oneDNN linears: same numbers as the model they view, and the model itself is left alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from generation.cpu.fused_linear import FusedMember, FusedProjections
from generation.cpu.packed_linear import PackedLinear, packing_available
from generation.cpu.packed_view import packed_view

TINY = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
# relative error of the logits: fp32 differs only in summation order; bf16 rounds every activation
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def tiny_model(dtype: torch.dtype) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**TINY)).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_view_matches_model_and_shares_weights(dtype):
    model = tiny_model(dtype)
    if not packing_available(model):
        pytest.skip(f"this CPU/torch build cannot pack {dtype}")
    view = packed_view(model)
    ids = torch.randint(0, TINY["vocab_size"], (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model(ids).logits.float()
        got = view(ids).logits.float()
    assert ((got - want).abs().max() / want.abs().max()).item() <= TOLERANCE[dtype]
    # every linear of the view is packed; the caller's model still has plain nn.Linear layers
    assert not any(isinstance(m, nn.Linear) for m in view.modules())
    assert sum(isinstance(m, PackedLinear) for m in view.modules()) == 2 * 2 + 1  # o, down per layer; head
    assert sum(isinstance(m, FusedMember) for m in view.modules()) == 2 * 5  # q k v and gate up, fused
    assert all(isinstance(m, nn.Linear) for m in [model.lm_head, model.model.layers[0].self_attn.q_proj])
    # non-linear parameters are the same tensors, not copies
    assert view.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert view.model.norm.weight.data_ptr() == model.model.norm.weight.data_ptr()


def test_packed_linear_any_row_count_and_bias():
    linear = nn.Linear(32, 40, bias=True)
    if not packing_available(linear):
        pytest.skip("this CPU/torch build cannot pack float32")
    packed = PackedLinear(linear)
    for shape in [(1, 32), (3, 32), (4, 32), (16, 32), (2, 5, 32), (300, 32)]:  # both sides of PLAIN_BELOW_ROWS
        x = torch.randn(*shape)
        with torch.inference_mode():
            torch.testing.assert_close(packed(x), linear(x), rtol=1e-5, atol=1e-5)


def test_packing_refuses_what_it_cannot_do():
    model = tiny_model(torch.float32).to(torch.float64)
    assert not packing_available(model)
    with pytest.raises(ValueError, match="packed linear weights need"):
        packed_view(model)


@pytest.mark.parametrize("rows", [1, 3, 4, 16])  # both sides of PLAIN_BELOW_ROWS
def test_fused_siblings_equal_their_linears_in_any_call_pattern(rows):
    gen = torch.Generator().manual_seed(2)
    linears = [nn.Linear(32, n, bias=True) for n in (24, 8, 8)]
    for lin in linears:
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen))
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen))
    if not packing_available(linears[0]):
        pytest.skip("this CPU/torch build cannot pack float32")
    group = FusedProjections(linears)
    members = [FusedMember(group, i, lin) for i, lin in enumerate(linears)]
    x, other = torch.randn(rows, 32, generator=gen), torch.randn(rows, 32, generator=gen)
    with torch.inference_mode():
        want = [lin(x) for lin in linears]
        # the model's own order; then out of order; then a sibling called with another input in between
        for order in ([0, 1, 2], [2, 1, 0], [1, 0, 2]):
            got = {i: members[i](x) for i in order}
            for i in range(3):
                torch.testing.assert_close(got[i], want[i], rtol=1e-5, atol=1e-5)
        first = members[0](x)
        torch.testing.assert_close(members[1](other), linears[1](other), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(members[1](x), want[1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(members[2](x), want[2], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(first, want[0], rtol=1e-5, atol=1e-5)
        # a slice is handed out once: a second call for the same input computes again, still exact
        torch.testing.assert_close(members[1](x), want[1], rtol=1e-5, atol=1e-5)
