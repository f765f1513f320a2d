"""An upgrade gate: the baseline recorded under transformers 4.49.0, the candidate under
5.24.0 with a change planted in eager attention's softmax (the scores rounded to bf16 before
an fp32 softmax, as a refactor that moves the upcast after a cast would do). What the issue
#46 author ran to test the upgrade path: the verdict named ``model.layers`` (a ModuleList
that never runs) as a "proven" origin, the walk up having skipped ``self_attn`` and
``layers.0`` because their mask and ``cache_position`` inputs changed shape between releases.

Baseline release from the registry (4.49.0, in its own venv); the candidate is this
interpreter's transformers with the plant (``eager_attention_forward`` of Qwen2 replaced).
User path: the user's own fine-tune loop recorded with ``Recorder`` (stats) under each
release (weights at ``initializer_range=0.2``: attention scores of O(1), as in a trained
checkpoint, where the rounding shows). Twin: the same upgrade without the plant (a clean
upgrade must pass)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _loop import train
from _tiny import main, tiny_qwen2


def planted_eager(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]]
    weights = weights.to(torch.bfloat16)  # the plant: the scores rounded before the fp32 softmax
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers.models.qwen2 import modeling_qwen2

    original = modeling_qwen2.eager_attention_forward
    if side == "buggy" and trigger:
        modeling_qwen2.eager_attention_forward = planted_eager
    try:
        train(out, tiny_qwen2(initializer_range=0.2))
    finally:
        modeling_qwen2.eager_attention_forward = original  # the twin runs without the plant


if __name__ == "__main__":
    main(record)
