"""Grouped decode attention: where the rows split, and decode logits equal to a plain forward of each row."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from generation.cpu.slot_attention import ATTENTION_NAME, MIN_SAVING, plan_row_groups
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner

TINY = dict(vocab_size=96, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True)


def groups_for(positions):
    arange = torch.arange(max(positions) + 1)
    return plan_row_groups(positions, arange, torch.tensor(positions))


def test_equal_lengths_stay_one_group_without_mask():
    (group,) = groups_for([40] * 8)
    assert (group.start, group.stop, group.kv_len, group.mask) == (0, 8, 41, None)


def test_long_then_short_rows_split_where_reading_is_least():
    positions = [199, 190, 180, 20, 15, 10]
    first, second = groups_for(positions)
    assert (first.start, first.stop, first.kv_len) == (0, 3, 200)
    assert (second.start, second.stop, second.kv_len) == (3, 6, 21)
    assert 3 * 200 + 3 * 21 <= (1 - MIN_SAVING) * 6 * 200
    # each row's mask admits exactly its own positions 0..p
    for group in (first, second):
        for i, row in enumerate(range(group.start, group.stop)):
            allowed = group.mask[i, 0, 0]
            assert allowed.sum().item() == positions[row] + 1 and bool(allowed[: positions[row] + 1].all())


def test_small_saving_keeps_one_call():
    # splitting [100, 99 | 90, 89] would save under MIN_SAVING of the keys read
    assert len(groups_for([100, 99, 90, 89])) == 1


def test_interleaved_lengths_do_not_split():
    assert len(groups_for([200, 10, 10, 200])) == 1  # every contiguous cut still has a long row on each side


def test_grouped_decode_matches_plain_forward_per_row():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    # native_kernels=False: the SDPA row-group path (with the kernels built, decode takes native.py's)
    runner = ModelRunner(model, CacheConfig(num_blocks=64, max_model_len=128), packed_weights=True,
                         native_kernels=False)
    if not runner.slot_attention:
        pytest.skip("packing (and so the engine's own view) is unavailable on this machine")
    assert model.config._attn_implementation != ATTENTION_NAME  # the caller's model is left alone
    gen = torch.Generator().manual_seed(3)
    lengths = [90, 84, 70, 12, 9, 5]  # long rows then short ones: the step runs as two groups
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    free = list(range(64))
    tables = [[free.pop() for _ in range(-(-(n + 1) // 16))] for n in lengths]  # scattered, out of order
    runner.prefill(prompts, [0] * len(prompts), tables)
    tokens = torch.randint(0, TINY["vocab_size"], (len(lengths),), generator=gen)
    positions = torch.tensor(lengths)
    assert len(plan_row_groups(lengths, runner.positions, positions)) == 2
    got = runner.decode(tokens, lengths, tables)
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            want = model(torch.tensor([prompt + [int(tokens[row])]])).logits[0, -1]
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-4)
