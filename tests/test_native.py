"""The C++ engine kernels (generation/cpu/native.py) against torch and transformers references.

Each kernel is checked against the ops it replaces: decode attention against SDPA over each row's own
keys, the rotary embedding and cache write bit for bit against transformers' apply_rotary_pos_emb,
RMSNorm against LlamaRMSNorm, silu * up against torch; then a tiny Llama's decode logits through the
runner (native on, native off) against a plain forward. CI installs g++, so there the kernels must build.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from generation.cpu import decode_linear, native, paged_native
from generation.cpu.native_layers import NativeAttention, NativeGatedMLP, NativeRMSNorm
from generation.cpu.packed_linear import packing_available
from generation.kv_cache import CacheConfig
from generation.runner import ModelRunner

DTYPES = (torch.float32, torch.bfloat16)
ATOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}

if not native.available(torch.float32, torch.device("cpu")):
    if os.environ.get("CI"):
        raise RuntimeError("CI: the native kernels must build here (is g++ installed?)")
    pytest.skip("no C++ compiler: the native kernels are not built", allow_module_level=True)


def reference_attention(query, keys, values, lengths, scale):
    """Per row: SDPA of its query heads over its own first lengths[b] keys (GQA by repeating kv heads)."""
    group = query.shape[1] // keys.shape[1]
    rows = []
    for b, n in enumerate(lengths.tolist()):
        k = keys[b:b + 1, :, :n].float().repeat_interleave(group, 1)
        v = values[b:b + 1, :, :n].float().repeat_interleave(group, 1)
        rows.append(F.scaled_dot_product_attention(query[b:b + 1].float(), k, v, scale=scale).transpose(1, 2))
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 8, 128), (4, 2, 48), (6, 1, 64)])
def test_decode_attention_matches_sdpa_per_row(dtype, heads, kv_heads, dim):
    # 64/128 take the AVX-512 path where the CPU has it, 48 the portable one; group sizes 1, 2, 3, 6
    gen = torch.Generator().manual_seed(heads * dim)
    slots, max_len = 7, 80
    keys = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dtype)
    values = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dtype)
    lengths = torch.tensor([1, 80, 17, 16, 33, 2])  # a single key, the whole buffer, block edges
    query = torch.randn(len(lengths), heads, 1, dim, generator=gen).to(dtype)
    longest = int(lengths.max())
    got = native.decode_attention(query, keys[:len(lengths), :, :longest], values[:len(lengths), :, :longest],
                                  lengths, scale=dim ** -0.5)
    assert got.shape == (len(lengths), 1, heads, dim) and got.dtype == dtype
    want = reference_attention(query, keys, values, lengths, dim ** -0.5)
    torch.testing.assert_close(got.float(), want, atol=ATOL[dtype], rtol=ATOL[dtype])


def test_decode_attention_refuses_lengths_outside_the_keys():
    keys = torch.randn(2, 1, 8, 64)
    query = torch.randn(2, 2, 1, 64)
    for lengths in ([3, 9], [0, 4]):
        with pytest.raises(ValueError, match="every length must be in 1..8"):
            native.decode_attention(query, keys, keys, torch.tensor(lengths))
    with pytest.raises(ValueError, match="int64"):
        native.decode_attention(query, keys, keys, torch.tensor([1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="do not fit"):  # fewer key rows than queries, another head dim
        native.decode_attention(query, keys[:1], keys[:1], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="do not fit"):
        native.decode_attention(query, keys[..., :32], keys[..., :32], torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="float32/bfloat16"):
        native.decode_attention(query.half(), keys.half(), keys.half(), torch.tensor([1, 2]))


def rotary(positions, dim, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions[:, None].float() * inv[None]
    emb = torch.cat([angles, angles], -1)
    return emb.cos()[:, None].to(dtype), emb.sin()[:, None].to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [64, 40])  # whole-vector halves, and the scalar fallback
def test_rope_cache_attention_is_transformers_rope_then_attention(dtype, dim):
    gen = torch.Generator().manual_seed(dim)
    batch, heads, kv_heads, max_len = 5, 6, 2, 64
    keys = torch.randn(batch + 1, kv_heads, max_len, dim, generator=gen).to(dtype)
    values = torch.randn(batch + 1, kv_heads, max_len, dim, generator=gen).to(dtype)
    before_k, before_v = keys.clone(), values.clone()
    qkv = torch.randn(batch, 1, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    positions = torch.tensor([0, 63, 10, 31, 5])
    cos, sin = rotary(positions, dim, dtype)
    out = native.rope_cache_attention(qkv, cos, sin, keys, values, positions, heads, dim ** -0.5)

    q = qkv[..., :heads * dim].view(batch, 1, heads, dim).transpose(1, 2)
    k = qkv[..., heads * dim:(heads + kv_heads) * dim].view(batch, 1, kv_heads, dim).transpose(1, 2)
    v = qkv[..., (heads + kv_heads) * dim:].view(batch, 1, kv_heads, dim).transpose(1, 2)
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    rows = torch.arange(batch)
    assert torch.equal(keys[rows, :, positions], k_rot[:, :, 0])  # bit for bit, every dtype
    assert torch.equal(values[rows, :, positions], v[:, :, 0])
    untouched = torch.ones(batch + 1, max_len, dtype=torch.bool)
    untouched[rows, positions] = False
    assert torch.equal(keys.transpose(1, 2)[untouched], before_k.transpose(1, 2)[untouched])
    assert torch.equal(values.transpose(1, 2)[untouched], before_v.transpose(1, 2)[untouched])
    want = reference_attention(q_rot, keys, values, positions + 1, dim ** -0.5)
    torch.testing.assert_close(out.float().view(batch, 1, heads, dim), want, atol=ATOL[dtype], rtol=ATOL[dtype])


def test_rope_cache_attention_refuses_a_position_past_the_cache_and_writes_nothing():
    keys = torch.zeros(2, 1, 8, 64)
    values = torch.zeros(2, 1, 8, 64)
    qkv = torch.randn(2, 1, 4 * 64)
    cos, sin = rotary(torch.tensor([1, 8]), 64, torch.float32)
    with pytest.raises(ValueError, match="every position must be in 0..7"):
        native.rope_cache_attention(qkv, cos, sin, keys, values, torch.tensor([1, 8]), 2, 0.125)
    assert not keys.any() and not values.any()


def test_cache_write_puts_each_row_at_its_position():
    keys = torch.zeros(4, 2, 10, 64)
    values = torch.zeros(4, 2, 10, 64)
    new_k = torch.randn(3, 2, 1, 64)
    new_v = torch.randn(3, 1, 2, 64).transpose(1, 2)  # the strided layout attention blocks produce
    positions = torch.tensor([0, 9, 4])
    native.cache_write(keys, values, new_k, new_v, positions)
    for b, p in enumerate(positions.tolist()):
        assert torch.equal(keys[b, :, p], new_k[b, :, 0]) and torch.equal(values[b, :, p], new_v[b, :, 0])
    assert int((keys != 0).any(-1).sum()) == 6  # nothing else written
    with pytest.raises(ValueError, match="every position must be in 0..9"):
        native.cache_write(keys, values, new_k, new_v, torch.tensor([0, 10, 1]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_llama_rms_norm(dtype):
    gen = torch.Generator().manual_seed(1)
    norm = LlamaRMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=gen) * 0.5 + 1)
    norm = norm.to(dtype)
    x = (torch.randn(16, 3, 576, generator=gen) * 3).to(dtype)
    with torch.inference_mode():
        got, want = native.rms_norm(x, norm.weight, 1e-5), norm(x)
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)  # the fp32 sum's last bit vanishes in the bf16 rounding
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)  # the kernel sums in its own order


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_torch(dtype):
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(16, 1, 2 * 1000, generator=gen) * 4).to(dtype)  # 1000: a partial last vector
    got = native.silu_mul(gate_up)
    want = F.silu(gate_up[..., :1000]) * gate_up[..., 1000:]
    if dtype == torch.bfloat16:  # at most one bf16 step apart, and almost always equal
        assert (got != want).float().mean() < 0.01
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=1e-3)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not decode_linear.decode_linear_available(), reason="this CPU has no AVX-512: no packed decode linear")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])
@pytest.mark.parametrize("out_features,bias", [(64, True), (48, False), (16, True)])  # pairs, pair + tail, tail
def test_packed_decode_linear_matches_f_linear(dtype, rows, out_features, bias):
    gen = torch.Generator().manual_seed(rows * out_features)
    weight = torch.randn(out_features, 40, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    x = torch.randn(rows, 1, 40, generator=gen).to(dtype)
    kernel = decode_linear.PackedDecodeLinear(weight, b)
    got = kernel(x)
    assert got.shape == (rows, 1, out_features) and got.dtype == dtype
    # fp32 accumulation in both; bf16 outputs may differ by one rounding step
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), F.linear(x, weight, b).float(), rtol=tol, atol=tol)
    strided = torch.randn(rows, 80, generator=gen).to(dtype)[:, ::2]  # not contiguous: copied first
    torch.testing.assert_close(kernel(strided).float(), F.linear(strided, weight, b).float(), rtol=tol, atol=tol)
    assert kernel(torch.empty(0, 40, dtype=dtype)).shape == (0, out_features)


@pytest.mark.parametrize("rows", [1, 2, 9, 64, 70])  # the 1-row kernel, tiles, a full row block, past one
@pytest.mark.parametrize("in_features", [7, 41, 576])  # bf16 packs inputs in pairs: odd counts pad the last one
def test_bf16_weights_in_pairs_match_f_linear_at_every_row_count(rows, in_features):
    gen = torch.Generator().manual_seed(rows + in_features)
    weight = torch.randn(48, in_features, generator=gen).bfloat16()
    b = torch.randn(48, generator=gen).bfloat16()
    x = torch.randn(rows, in_features, generator=gen).bfloat16()
    kernel = decode_linear.PackedDecodeLinear(weight, b)
    assert kernel.packed.numel() == 48 * (in_features + in_features % 2)
    want = F.linear(x.float(), weight.float(), b.float())
    torch.testing.assert_close(kernel(x).float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))
    alone = torch.cat([kernel(x[i:i + 1]) for i in range(rows)])  # each row alone: the same bits as in the batch
    assert torch.equal(alone, kernel(x))


@pytest.mark.skipif(not decode_linear.decode_linear_available(), reason="this CPU has no AVX-512: no packed decode linear")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_features,in_features,bias", [(960, 576, False), (176, 40, True), (16, 1536, True),
                                                           (48, 7, False)])
def test_the_one_row_kernel_gives_the_tiles_bits(dtype, out_features, in_features, bias):
    """A batch-1 step's linears (provmark_gemv) sum each output in the tile kernel's order: the same bits, so
    a request's tokens do not depend on whether it decodes alone or beside others."""
    gen = torch.Generator().manual_seed(out_features + in_features)
    weight = torch.randn(out_features, in_features, generator=gen).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    kernel = decode_linear.PackedDecodeLinear(weight, b)
    assert kernel.gemv_rows == 1
    before = torch.get_num_threads()
    for threads in (1, 2, 3):
        x = torch.randn(1, in_features, generator=gen).to(dtype)
        with torch.inference_mode():
            torch.set_num_threads(threads)
            try:
                one = kernel(x)
                kernel.gemv_rows = 0
                tiled = kernel(x)
                kernel.gemv_rows = 1
            finally:
                torch.set_num_threads(before)
        assert torch.equal(one, tiled)
        tol = 1e-4 if dtype == torch.float32 else 2e-2  # sums of up to 1,536 products in another order
        torch.testing.assert_close(one.float(), F.linear(x, weight, b).float(), rtol=tol, atol=tol)


def test_packed_decode_linear_refuses_what_it_cannot_take():
    with pytest.raises(ValueError, match="multiple of 16"):
        decode_linear.PackedDecodeLinear(torch.randn(20, 8), None)
    with pytest.raises(ValueError, match="float32/bfloat16"):
        decode_linear.PackedDecodeLinear(torch.randn(16, 8).half(), None)
    with pytest.raises(ValueError, match="does not fit 8 torch.float32 inputs"):
        decode_linear.PackedDecodeLinear(torch.randn(16, 8), None)(torch.randn(2, 9))
    with pytest.raises(ValueError, match="does not fit"):
        decode_linear.PackedDecodeLinear(torch.randn(16, 8), None)(torch.randn(2, 8).bfloat16())


def scattered_tables(lengths: list[int], extra: int, num_blocks: int, block_size: int = 16) -> list[list[int]]:
    """Block tables for sequences of these lengths (+ extra tokens), handed out from the top of the pool down,
    so no row's blocks are contiguous or in order."""
    free = list(range(num_blocks))
    return [[free.pop() for _ in range(-(-(n + extra) // block_size))] for n in lengths]


TINY = {"vocab_size": 128, "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 128,
        "tie_word_embeddings": True}


@pytest.mark.parametrize("dtype", DTYPES)
def test_runner_decode_with_native_kernels_matches_a_plain_forward(dtype):
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).to(dtype).eval()
    if not packing_available(model):  # the native path runs on packed weights (oneDNN's self-check decides)
        pytest.skip(f"oneDNN has no packed {dtype} linear on this CPU: the engine runs {dtype} on torch ops")
    runner = ModelRunner(model, CacheConfig(num_blocks=64, max_model_len=128), native_kernels=True)
    view_modules = [type(m) for m in runner.decoder.modules()]
    assert view_modules.count(NativeAttention) == 2 and view_modules.count(NativeGatedMLP) == 2
    assert view_modules.count(NativeRMSNorm) == 5  # two per layer and the final norm
    # every packed linear (o, down, LM head) and fused group (qkv, gate/up) gets the decode kernel
    # every one (4 per layer and the LM head) where the CPU has AVX-512; none elsewhere (oneDNN stays)
    assert runner.native_linears == (9 if decode_linear.decode_linear_available() else 0)
    assert not any(isinstance(m, (NativeAttention, NativeRMSNorm)) for m in model.modules())  # caller's untouched
    gen = torch.Generator().manual_seed(3)
    lengths = [40, 33, 20, 7, 5, 1]
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    tables = scattered_tables(lengths, 2, 64)
    runner.prefill(prompts, [0] * len(prompts), tables)
    tokens = torch.randint(0, TINY["vocab_size"], (len(lengths),), generator=gen)
    got = runner.decode(tokens, lengths, tables)
    followups = torch.randint(0, TINY["vocab_size"], (len(lengths),), generator=gen)
    got2 = runner.decode(followups, [n + 1 for n in lengths], tables)  # reads the keys it wrote
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            logits = model(torch.tensor([prompt + [int(tokens[row]), int(followups[row])]])).logits[0].float()
            torch.testing.assert_close(got[row], logits[-2], rtol=tol, atol=tol)
            torch.testing.assert_close(got2[row], logits[-1], rtol=tol, atol=tol)


def test_attention_blocks_not_swapped_still_decode_through_the_kernels(monkeypatch):
    # an attention class outside ATTENTION_CLASSES keeps transformers' block: its cache update writes
    # through paged_native.cache_write and the attention interface calls paged_native.decode_attention
    from generation.cpu import native_layers

    monkeypatch.setattr(native_layers, "ATTENTION_CLASSES", frozenset())
    calls = {"write": 0, "attend": 0}
    for name, key in (("cache_write", "write"), ("decode_attention", "attend")):
        original = getattr(paged_native, name)

        def counted(*args, _original=original, _key=key, **kwargs):
            calls[_key] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(paged_native, name, counted)
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    runner = ModelRunner(model, CacheConfig(num_blocks=16, max_model_len=64), native_kernels=True)
    assert not any(isinstance(m, NativeAttention) for m in runner.decoder.modules())
    lengths = [20, 9, 3]
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lengths]
    tables = scattered_tables(lengths, 1, 16)
    runner.prefill(prompts, [0] * len(prompts), tables)  # the prompts' tokens as rows too (no padding)
    assert calls == {"write": TINY["num_hidden_layers"], "attend": TINY["num_hidden_layers"]}
    calls.update(write=0, attend=0)
    tokens = torch.randint(0, TINY["vocab_size"], (len(lengths),), generator=gen)
    got = runner.decode(tokens, lengths, tables)
    assert calls == {"write": TINY["num_hidden_layers"], "attend": TINY["num_hidden_layers"]}
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            want = model(torch.tensor([prompt + [int(tokens[row])]])).logits[0, -1]
            torch.testing.assert_close(got[row], want, rtol=1e-4, atol=1e-4)


def test_runner_without_native_kernels_keeps_transformers_modules():
    model = LlamaForCausalLM(LlamaConfig(**TINY)).eval()
    runner = ModelRunner(model, CacheConfig(num_blocks=4, max_model_len=32), native_kernels=False)
    assert not runner.native_attention and runner.native_layers == 0
    assert not any(isinstance(m, (NativeAttention, NativeGatedMLP, NativeRMSNorm)) for m in runner.decoder.modules())


def test_build_is_cached_and_a_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVMARK_KERNEL_DIR", str(tmp_path))
    first = native.build()
    assert first.parent == tmp_path and first.name.startswith("engine_kernels-")
    stamp = first.stat().st_mtime_ns
    assert native.build() == first and first.stat().st_mtime_ns == stamp  # no rebuild
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary files left
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="is not an executable"):
        native.build(force=True)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # the good build is kept


@pytest.mark.parametrize("spec", ["kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0",
                                  "kgw:scheme=lefthash,h=1,gamma=0.5,delta=1.5",
                                  "kgw:scheme=minhash,h=3,gamma=0.25,delta=2.0",
                                  "kgw:scheme=lefthash,h=2,gamma=0.25,delta=2.0,hard=true",
                                  "kgw:scheme=selfhash,h=2,gamma=0.5,delta=2.0,hard=true",
                                  "kgw:scheme=unigram,gamma=0.25,delta=2.0"])
def test_watermark_bias_backend_equals_the_tensor_code(spec):
    from watermark import greenlist
    from watermark.config import WatermarkSpec
    from watermark.scheme import Watermark

    vocab = 5000
    mark = Watermark(WatermarkSpec.parse(spec), b"k" * 32, vocab, key_id="t")
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, vocab, generator=gen)
    histories = torch.randint(0, vocab, (6, 5), generator=gen).tolist()
    greenlist.set_bias_backend(None)
    try:
        want = mark.bias(logits.clone(), histories)
        calls = []

        def counting(*args):
            calls.append(1)
            return native.watermark_bias(*args)

        greenlist.set_bias_backend(counting)
        got = mark.bias(logits.clone(), histories)
    finally:
        greenlist.set_bias_backend(None)
    assert calls, "the backend was not used"
    assert torch.equal(got, want)  # the same green lists, bit for bit
    assert not torch.equal(got, logits)


@pytest.mark.parametrize("spec", ["kgw:scheme=selfhash,h=4,gamma=0.25,delta=2.0,code_delta=3.5",
                                  "kgw:scheme=lefthash,h=1,gamma=0.5,delta=1.5,code_delta=3.0"])
def test_watermark_bias_per_row_deltas_in_one_pass_equal_the_two_groups(spec):
    """Rows writing code and prose in one batch: the C++ kernel biases each row at its own delta in one call,
    bit for bit what the tensor code does in two groups."""
    from watermark import greenlist
    from watermark.config import WatermarkSpec
    from watermark.scheme import Watermark

    vocab = 5000
    mark = Watermark(WatermarkSpec.parse(spec), b"k" * 32, vocab, key_id="t")
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(7, vocab, generator=gen)
    histories = torch.randint(0, vocab, (7, 5), generator=gen).tolist()
    code = [True, False, False, True, False, True, False]
    greenlist.set_bias_backend(None)
    try:
        want = mark.bias(logits.clone(), histories, code)
        calls = []

        def counting(*args):
            calls.append(args[7])  # delta
            return native.watermark_bias(*args)

        greenlist.set_bias_backend(counting)
        got = mark.bias(logits.clone(), histories, code)
    finally:
        greenlist.set_bias_backend(None)
    assert len(calls) == 1 and isinstance(calls[0], torch.Tensor)  # one pass, per-row deltas
    assert torch.equal(got, want)
    raised = (got - logits).max(1).values
    assert torch.allclose(raised, torch.tensor([mark.spec.code_delta if c else mark.spec.delta for c in code]))
