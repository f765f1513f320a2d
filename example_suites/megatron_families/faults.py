"""Deliberate faults planted in the Megatron side through a model's ``patch:``."""

from __future__ import annotations

from typing import Any

import torch


def scale_layer1_mlp(model: torch.nn.Module) -> None:
    """Megatron MLP of layer 1 returns 1.1x its output: a bug in that MLP's own code."""
    mlp = model.decoder.layers[1].mlp
    original = mlp.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = original(*args, **kwargs)
        return out * 1.1, bias

    mlp.forward = forward


def scale_layer0_k_norm(model: torch.nn.Module) -> None:
    """Layer 0's per-head RMSNorm of k (Megatron's k_layernorm) returns 1.05x its output: a bug
    in the norm Qwen3 adds over Qwen2."""
    norm = model.decoder.layers[0].self_attention.k_layernorm
    original = norm.forward
    norm.forward = lambda *args, **kwargs: original(*args, **kwargs) * 1.05
