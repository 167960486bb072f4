"""The engine's C++ kernels on a CPU without AVX-512 (most desktop CPUs: AVX2 and FMA only).

The library is built here for x86-64-v3 (AVX2, FMA, no AVX-512) in a separate process, as such a CPU would build
it: it must compile, refuse the AVX-512-only linears with -1 (the engine then keeps oneDNN's or
torch's linears), and the engine's view must still decode through the kernels it has (attention, RMSNorm,
silu * up) with the logits of a plain forward."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from generation.cpu import native

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="builds for an x86-64 level")

SCRIPT = textwrap.dedent("""
    import json, torch
    from generation.cpu import native
    native.FLAGS = tuple("-march=x86-64-v3" if f == "-march=native" else f for f in native.FLAGS
                         if f != "-mprefer-vector-width=512")
    from transformers import LlamaConfig, LlamaForCausalLM
    from generation.cpu import decode_linear
    from generation.cpu.native_layers import NativeAttention, NativeRMSNorm
    from generation.kv_cache import CacheConfig
    from generation.runner import ModelRunner

    lib = native._checked_library()
    out = {"linear_available": decode_linear.decode_linear_available()}
    x, w, packed, y = torch.ones(1, 32), torch.ones(32, 32), torch.empty(32 * 32), torch.empty(1, 32)
    out["pack"] = lib.provmark_pack_linear(0, w.data_ptr(), 32, packed.data_ptr(), 32, 32)
    out["linear"] = lib.provmark_linear(0, x.data_ptr(), packed.data_ptr(), None, y.data_ptr(), 1, 32, 32, 1)
    out["gemv"] = lib.provmark_gemv(0, x.data_ptr(), packed.data_ptr(), None, y.data_ptr(), 32, 32, 1)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128)
    model = LlamaForCausalLM(config).eval()
    runner = ModelRunner(model, CacheConfig(num_blocks=32, max_model_len=128), native_kernels=True)
    kinds = [type(m) for m in runner.decoder.modules()]
    out["attention_blocks"], out["norms"] = kinds.count(NativeAttention), kinds.count(NativeRMSNorm)
    out["native_linears"] = runner.native_linears
    gen = torch.Generator().manual_seed(3)
    lengths = [21, 9, 2]
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in lengths]
    tables = [[5, 3], [7], [1]]
    runner.prefill(prompts, [0] * len(prompts), tables)
    tokens = torch.randint(0, 128, (len(lengths),), generator=gen)
    got = runner.decode(tokens, lengths, tables)
    worst = 0.0
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            want = model(torch.tensor([prompt + [int(tokens[row])]])).logits[0, -1]
            worst = max(worst, float((got[row] - want).abs().max()))
    out["worst_logit_error"] = worst
    print(json.dumps(out))
""")


def test_the_kernels_build_and_decode_on_a_cpu_without_avx512(tmp_path):
    if native._compiler() is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI: the native kernels must build here (is g++ installed?)")
        pytest.skip("no C++ compiler")
    env = {**os.environ, "PROVMARK_KERNEL_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert [p.name.startswith("engine_kernels-") for p in tmp_path.iterdir()] == [True]  # built for v3, here
    assert got["linear_available"] is False
    assert got["pack"] == 0  # repacking is plain C++
    assert got["linear"] == -1 and got["gemv"] == -1
    assert got["native_linears"] == 0  # oneDNN's (or torch's) linears stay
    assert got["attention_blocks"] == 2 and got["norms"] == 5
    assert got["worst_logit_error"] < 1e-4
