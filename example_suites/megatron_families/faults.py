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


def _scale_expert_fc2(model: torch.nn.Module, layer: int, expert: int) -> None:
    """Expert ``expert`` of layer ``layer``'s MoE block: its fc2 returns 1.05x its output."""
    fc2 = model.decoder.layers[layer].mlp.experts.local_experts[expert].linear_fc2
    original = fc2.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = original(*args, **kwargs)
        return out * 1.05, bias

    fc2.forward = forward


def scale_layer1_expert2_fc2(model: torch.nn.Module) -> None:
    """A bug in one expert (Mixtral, layer 1, expert 2): HF's experts are one fused module, so
    the fault is named at the MoE block it is in."""
    _scale_expert_fc2(model, 1, 2)


def scale_layer0_expert1_fc2(model: torch.nn.Module) -> None:
    """A bug in one expert (Qwen3-MoE, layer 0, expert 1)."""
    _scale_expert_fc2(model, 0, 1)


def scale_layer1_expert3_fc2_on_its_rank(model: torch.nn.Module) -> None:
    """Global expert 3 of layer 1 on the expert-parallel rank that holds it (the second of 2)."""
    from megatron.core import parallel_state

    local = len(model.decoder.layers[1].mlp.experts.local_experts)
    if parallel_state.get_expert_model_parallel_rank() == 3 // local:
        _scale_expert_fc2(model, 1, 3 % local)
