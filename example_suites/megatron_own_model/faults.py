"""Bugs planted in the Megatron side (the user's Gemma2-like model) through a model's ``patch:``."""

from __future__ import annotations

from typing import Any

import torch


def softcap_dropped_layer1(model: Any) -> None:
    """Layer 1's attention forgets Gemma2's logit soft-capping (a port that missed it in one
    layer): the raw scores go to the softmax."""
    model.decoder.layers[1].self_attention.core_attention.scale_mask_softmax.softcap = None


def norm_without_one_layer0(model: Any) -> None:
    """Layer 0's norm after the MLP scales by ``w`` instead of Gemma's ``1 + w`` (the Llama
    RMSNorm a port copied in one place)."""
    norm = model.decoder.layers[0].post_mlp_layernorm

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps)
        return (h * norm.weight.float()).type_as(x)

    norm.forward = forward
