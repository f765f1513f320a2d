"""Deliberate faults injected into the Megatron side through a model's ``patch:``."""

from __future__ import annotations

import weakref
from typing import Any

import torch


class _ScaledOutput(torch.nn.Module):
    """Runs the wrapped Megatron module and scales its output (its own code, after children)."""

    def __init__(self, inner: torch.nn.Module, scale: float) -> None:
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out, bias = self.inner(*args, **kwargs)
        return out * self.scale, bias


def scale_layer1_mlp(model: torch.nn.Module) -> None:
    """Megatron MLP of layer 1 returns 1.1x its output: a bug in that MLP's own code."""
    layer = model.decoder.layers[1]
    mlp = layer.mlp
    original = mlp.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = original(*args, **kwargs)
        return out * 1.1, bias

    mlp.forward = forward


def scale_layer2_mlp(model: torch.nn.Module) -> None:
    """The MLP of global layer 2 returns 1.1x its output, wherever it is built: on a pipeline
    rank, the stage that holds it (Megatron's ``layer_number`` is global and 1-based); other
    stages are left unchanged."""
    for layer in model.decoder.layers:
        if layer.layer_number == 3:
            _scale_forward(layer.mlp, 1.1)


def _scale_forward(mlp: torch.nn.Module, scale: float) -> None:
    original = mlp.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = original(*args, **kwargs)
        return out * scale, bias

    mlp.forward = forward


def scale_layer0_k(model: torch.nn.Module) -> None:
    """Layer 0's fused ``linear_qkv`` returns its k heads 1.1x (q and v as they are): a bug in
    one of the three projections that HF keeps apart (``k_proj``). Megatron lays the fused
    output out per KV group as [q heads of the group, k, v]."""
    config = model.config
    d = config.kv_channels
    per = config.num_attention_heads // config.num_query_groups
    scale = torch.ones((per + 2) * d)
    scale[per * d : (per + 1) * d] = 1.1
    scale = scale.repeat(config.num_query_groups)
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    original = qkv.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out, bias = original(*args, **kwargs)
        return out * scale.to(out.dtype), bias

    qkv.forward = forward


def adamw_eps1e6(model: torch.nn.Module) -> None:
    """The AdamW that steps this model's parameters uses eps=1e-6 where the case says 1e-8
    (another framework's default): a bug in the optimizer, not in the model. Only optimizers
    over this model's parameters change; on launched ranks that is the rank's optimizer."""
    owned = {id(p): weakref.ref(p) for p in model.parameters()}
    original = torch.optim.AdamW.__init__

    def init(self: torch.optim.AdamW, params: Any, *args: Any, **kwargs: Any) -> None:
        params = list(params)
        flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        if any(_owns(owned, p) for p in flat):
            kwargs["eps"] = 1e-6
        original(self, params, *args, **kwargs)

    torch.optim.AdamW.__init__ = init  # type: ignore[method-assign]


def _owns(owned: dict[int, weakref.ref[torch.Tensor]], param: torch.Tensor) -> bool:
    ref = owned.get(id(param))
    return ref is not None and ref() is param
