"""The tiny causal language models of the tests' user scripts and runs: built from a config
with a fixed seed (nothing downloaded), eager attention, float32."""

from __future__ import annotations

from typing import Any

import torch

ARCHITECTURES = ("qwen2", "llama")


def tiny_causal_lm(
    arch: str = "qwen2",
    *,
    vocab: int = 128,
    hidden: int = 32,
    layers: int = 2,
    positions: int = 64,
    seed: int = 0,
    **config: Any,
) -> Any:
    """A ``Qwen2ForCausalLM`` (``arch="llama"``: ``LlamaForCausalLM``) ``hidden`` wide with
    ``hidden // 8`` attention heads, half as many key/value heads and an MLP twice as wide,
    its weights from ``torch.manual_seed(seed)``; ``config``: other config fields."""
    import transformers

    model_class = {"qwen2": transformers.Qwen2ForCausalLM, "llama": transformers.LlamaForCausalLM}[arch]
    torch.manual_seed(seed)
    made = model_class.config_class(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 8,
        num_key_value_heads=hidden // 16,
        max_position_embeddings=positions,
        **config,
    )
    made._attn_implementation = "eager"
    return model_class(made)
