"""The engine's view of the model on the native kernels (generation/cpu/native.py); the caller's model is untouched.

Swapped into the view made by generation/cpu/packed_linear.py, for a Llama-style decoder:

- ``NativeAttention``: a decode step's attention block is the fused q/k/v matmul, one kernel call (rotary
  embedding, cache write, attention over each row's own keys) and ``o_proj``;
- ``NativeRMSNorm`` and ``NativeGatedMLP``: one call instead of RMSNorm's seven small ops (twice a layer)
  and the MLP's ``silu(gate) * up`` pair;
- ``use_native_linears_``: the packed linears and fused projection groups get a decode kernel
  (``decode_linear.PackedDecodeLinear``) for the row counts where it beats oneDNN.

A norm, MLP or linear is swapped only when the replacement agrees with the original on random inputs of
the model's dtype at start-up (``SELF_CHECK_TOLERANCE`` of the largest output: the kernels sum in their
own order and use their own exp, so the last bit can differ, as it does between torch's own CPU kernels).
Anything the kernels do not take (another device or dtype, autograd, a prefill) goes to the original
module's forward.
"""

from __future__ import annotations

import torch
from torch import nn

from generation.cpu import decode_linear, native, paged_native
from generation.cpu.fused_linear import FusedMember
from generation.cpu.packed_linear import PackedLinear
from generation.cpu.slot_attention import GROUP_KWARG, RowLengths
from generation.kv_cache import PagedKVCache

# Norm classes whose forward is exactly LlamaRMSNorm's (weight * normed, no 1 + weight, no offset).
RMS_NORM_CLASSES = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
# Attention blocks that are exactly Llama's: q/k/v projections, rotary embedding by apply_rotary_pos_emb,
# cache update, attention, o_proj (no q/k norms, no sliding window: the paged cache refuses those models).
# Only Llama's is listed: the swap has no start-up check (it needs a cache), tests/test_native.py covers it.
ATTENTION_CLASSES = frozenset({"LlamaAttention"})
SILU_CLASSES = frozenset({"SiLU", "SiLUActivation"})  # torch's and transformers' (ACT2FN["silu"])
SELF_CHECK_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
# Rows up to which the native linear runs (all 30 layers' weights and the LM head at once, 2 threads;
# benchmarks/decode_linears.py, docs/engine.md). fp32: level with oneDNN or ahead up to 64 rows. bf16 (the weights
# in pairs, AVX512-BF16 dot products): ahead of oneDNN's kernels at 1, 8, 16 and 64 rows on the 2-core AMD EPYC
# (10.0 / 11.6 / 17.5 / 47.5 ms against 15.0 / 15.2 / 19.9 / 51.4). Where oneDNN has AMX (Sapphire Rapids), its
# bf16 kernels won at 16 rows over the earlier widening tile (15 vs 20 ms): not measured against the pairs there.
DECODE_KERNEL_ROWS = {torch.float32: 64, torch.bfloat16: 64}
INT8_ROWS = 1 << 40  # int8 weights: every row count runs the int8 kernel (there is no other copy of them)


def _eligible(x: torch.Tensor, dtype: torch.dtype) -> bool:
    return x.device.type == "cpu" and x.dtype == dtype and not (torch.is_grad_enabled() and x.requires_grad)


class NativeRMSNorm(nn.Module):
    """LlamaRMSNorm through ``native.rms_norm``; the original module for anything else."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.weight = original.weight
        self.variance_epsilon = float(original.variance_epsilon)
        self.__dict__["original"] = original  # not a submodule: its weight is already ours

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if _eligible(hidden_states, self.weight.dtype):
            return native.rms_norm(hidden_states, self.weight, self.variance_epsilon)
        return self.original(hidden_states)


class NativeGatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate/up as one fused matmul and the product as one kernel call."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = original.gate_proj, original.up_proj, original.down_proj
        self.__dict__["original"] = original

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _eligible(x, self.gate_proj.weight.dtype):
            gate_up = self.gate_proj.group.compute(x)
            if gate_up is not None:
                return self.down_proj(native.silu_mul(gate_up))
        return self.original(x)


class NativeAttention(nn.Module):
    """A Llama-style attention block whose decode step is the fused q/k/v matmul, one kernel call (rotary
    embedding, cache write, attention over each row's own keys) and ``o_proj``; the original block for
    everything else (prefill, other caches, anything the kernel does not take)."""

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (original.q_proj, original.k_proj, original.v_proj,
                                                              original.o_proj)
        self.layer_idx, self.heads = original.layer_idx, original.config.num_attention_heads
        self.scaling = float(original.scaling)
        self.__dict__["original"] = original

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                past_key_values=None, **kwargs):
        # transformers >= 5.24 names the argument `cache` (and passes it by keyword); older releases past_key_values
        past_key_values = kwargs.pop("cache", past_key_values)
        rows = kwargs.get(GROUP_KWARG)
        plan = getattr(past_key_values, "plan", None)
        if (isinstance(rows, RowLengths) and isinstance(past_key_values, PagedKVCache) and plan is not None
                and not plan.is_prefill and plan.pooled and hidden_states.shape[1] == 1
                and _eligible(hidden_states, self.o_proj.weight.dtype)):
            qkv = self.q_proj.group.compute(hidden_states)
            if qkv is not None:
                layer = past_key_values.layers[self.layer_idx]
                cos, sin = position_embeddings
                out = paged_native.rope_cache_attention(qkv, cos, sin, layer.keys, layer.values, rows.tables,
                                                        rows.positions, self.heads, self.scaling)
                return self.o_proj(out), None
        return self.original(hidden_states, position_embeddings, attention_mask, past_key_values, **kwargs)


def _is_fused_attention(module: nn.Module) -> bool:
    members = [getattr(module, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    return (type(module).__name__ in ATTENTION_CLASSES and all(isinstance(m, FusedMember) for m in members)
            and len({id(m.group) for m in members}) == 1 and [m.index for m in members] == [0, 1, 2]
            and hasattr(module, "o_proj") and hasattr(module, "layer_idx") and hasattr(module, "scaling"))


def _is_silu_gated_mlp(module: nn.Module) -> bool:
    gate, up = getattr(module, "gate_proj", None), getattr(module, "up_proj", None)
    return (isinstance(gate, FusedMember) and isinstance(up, FusedMember) and gate.group is up.group
            and gate.index == 0 and up.index == 1 and len(gate.group.sizes) == 2
            and type(getattr(module, "act_fn", None)).__name__ in SILU_CLASSES and hasattr(module, "down_proj"))


def _agrees(replacement: nn.Module, original: nn.Module, width: int, dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, width, generator=gen).to(dtype)
    with torch.inference_mode():
        try:
            got, want = replacement(x).float(), original(x).float()
        except (RuntimeError, ValueError):
            return False
    return _close(got, want, dtype)


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    """Largest difference within SELF_CHECK_TOLERANCE of the largest output (at least 1)."""
    return bool((got - want).abs().max() / want.abs().max().clamp_min(1.0) <= SELF_CHECK_TOLERANCE[dtype])


def use_native_layers_(view: nn.Module) -> int:
    """Swap the view's RMSNorm and SiLU-gated MLP modules for the native ones; how many were swapped.

    Nothing is swapped when the kernels are unavailable for the view's dtype or a class fails its check."""
    param = next(view.parameters())
    if param.dtype not in SELF_CHECK_TOLERANCE or not native.available(param.dtype, param.device):
        return 0
    checked: dict[type, bool] = {}
    swapped = 0
    for parent in list(view.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ in RMS_NORM_CLASSES and hasattr(child, "variance_epsilon"):
                replacement, width = NativeRMSNorm(child), child.weight.shape[0]
            elif _is_silu_gated_mlp(child):
                replacement, width = NativeGatedMLP(child), child.gate_proj.in_features
            elif _is_fused_attention(child):
                setattr(parent, name, NativeAttention(child))
                swapped += 1
                continue
            else:
                continue
            if type(child) not in checked:
                checked[type(child)] = _agrees(replacement, child, width, param.dtype)
            if checked[type(child)]:
                setattr(parent, name, replacement)
                swapped += 1
    return swapped


def use_native_linears_(view: nn.Module, int8: bool = False) -> int:
    """Give every packed linear and fused projection group of the view a decode kernel
    (``decode_linear.PackedDecodeLinear``, used up to ``DECODE_KERNEL_ROWS`` rows); how many were given one.

    ``int8``: the opt-in int8 weights instead (``decode_linear.Int8DecodeLinear``, float32 views only), for every
    row count, prefill included, so that one model computes every token.

    None is given unless the kernel agrees with ``F.linear`` on the first layer (SELF_CHECK_TOLERANCE; int8:
    against its own rounded weights)."""
    param = next(view.parameters())
    if param.dtype not in SELF_CHECK_TOLERANCE or not native.available(param.dtype, param.device):
        return 0
    if int8 and param.dtype != torch.float32:
        raise ValueError(f"int8 weights run on a float32 model, not {param.dtype}")
    targets: list[tuple[object, torch.Tensor, torch.Tensor | None]] = []
    groups: dict[int, list[FusedMember]] = {}
    for module in view.modules():
        if isinstance(module, PackedLinear) and module.out_features % 16 == 0:
            targets.append((module, module.weight, module.bias))
        elif isinstance(module, FusedMember):
            groups.setdefault(id(module.group), []).append(module)
    for members in groups.values():
        members.sort(key=lambda m: m.index)
        group = members[0].group
        if len(members) != len(group.sizes) or sum(group.sizes) % 16:
            continue
        biases = [m.bias for m in members]
        bias = None if biases[0] is None else torch.cat(biases)
        targets.append((group, torch.cat([m.weight for m in members]), bias))
    if not targets or not _linear_agrees(*targets[0][1:], int8=int8):
        return 0
    kernel = decode_linear.Int8DecodeLinear if int8 else decode_linear.PackedDecodeLinear
    for owner, weight, bias in targets:
        owner.decode_kernel = kernel(weight, bias)
        owner.decode_kernel_rows = INT8_ROWS if int8 else DECODE_KERNEL_ROWS[param.dtype]
        if int8:  # every row count runs the int8 kernel: oneDNN's float32 copy would only hold memory
            owner.packed_weight = None
    return len(targets)


def _linear_agrees(weight: torch.Tensor, bias: torch.Tensor | None, int8: bool = False) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, weight.shape[1], generator=gen).to(weight.dtype)
    try:
        with torch.inference_mode():
            if int8:
                quantized, scales = decode_linear.quantize_int8(weight)
                got = decode_linear.Int8DecodeLinear(weight, bias)(x)
                want = torch.nn.functional.linear(x, quantized.float() * scales[:, None], bias)
            else:
                got = decode_linear.PackedDecodeLinear(weight, bias)(x).float()
                want = torch.nn.functional.linear(x, weight, bias).float()
    except (RuntimeError, ValueError):
        return False
    return _close(got, want, weight.dtype)
