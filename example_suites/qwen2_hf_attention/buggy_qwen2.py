"""A tiny Qwen2 whose MLP in one layer scales its output: a deliberate, known bug."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


class ScaledMLP(torch.nn.Module):
    """Wraps the real MLP's submodules but multiplies the result by ``scale``."""

    def __init__(self, mlp: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.gate_proj = mlp.gate_proj
        self.up_proj = mlp.up_proj
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        return out * self.scale  # the bug


def build(layer: int = 1, scale: float = 1.1) -> torch.nn.Module:
    config = Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    model = Qwen2ForCausalLM(config)
    model.model.layers[layer].mlp = ScaledMLP(model.model.layers[layer].mlp, scale)
    return model
