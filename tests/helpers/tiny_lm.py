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


def tiny_qwen2_yaml(
    name: str, *, layers: int = 1, positions: int = 64, anchor: str = "", **fields: Any
) -> str:
    """A case file's ``models:`` entry (indented under ``models:``) of the same tiny Qwen2 as
    ``tiny_causal_lm``'s defaults: vocab 128, hidden 32, 4 heads / 2 KV heads, MLP 64;
    ``anchor``: a YAML anchor on its config (``&anchor``, for a Megatron twin's ``*anchor``);
    ``fields``: other config fields."""
    config = {
        "vocab_size": 128,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": positions,
        **fields,
    }
    flow = ", ".join(f"{k}: {_yaml_scalar(v)}" for k, v in config.items())
    mark = f"&{anchor} " if anchor else ""
    return (
        f"  {name}:\n    source: hf\n    class: transformers.Qwen2ForCausalLM\n"
        f"    attn_implementation: eager\n    config: {mark}{{{flow}}}\n"
    )


def _yaml_scalar(value: Any) -> str:
    """``value`` as YAML reads it back: ``false``, ``1.0e-06`` (YAML 1.1 reads ``1e-06`` as a
    string)."""
    if isinstance(value, bool):
        return str(value).lower()
    text = repr(value)
    return text.replace("e", ".0e", 1) if isinstance(value, float) and "." not in text else text
