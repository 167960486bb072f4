"""The small random Llama the native-kernel tests run (three layers, grouped query heads), and whether this
machine has the kernels they need (the C++ kernels with the AVX-512 decode linear)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from generation.cpu import decode_linear, native

TINY = {"vocab_size": 160, "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 256,
        "tie_word_embeddings": True}
NATIVE_LINEARS = native.available(torch.float32, torch.device("cpu")) and decode_linear.decode_linear_available()


def tiny_llama(dtype: torch.dtype = torch.float32, seed: int = 7, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY, "tie_word_embeddings": tied})).to(dtype).eval()
