"""Llama 3.1's ``rope_scaling`` (``rope_type: "llama3"``: the low frequencies divided by
``factor`` with a smooth blend) was dropped on a fine-tuning path, which then ran unscaled
RoPE: short inputs looked fine, long ones drifted (unsloth PR #6197, "Fix Llama 3.1+ rope
scaling dropped on the FastLanguageModel path": its replacement rotary class computed the
vanilla ``inv_freq`` and never read ``config.rope_scaling``).

Buggy side, a re-implementation: the model's rotary embedding's ``inv_freq`` is replaced by
the vanilla ``1 / theta ** (2i / d)``. A tiny Llama with ``original_max_position_embeddings``
4 so that rows of 6-16 tokens reach the scaled band. User path: the user's own fine-tune loop
recorded with ``Recorder`` (stats). Twin: a config without ``rope_scaling`` on both sides
(vanilla is then right)."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import build, main, small_config

SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 4,
}


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    extra = {"rope_scaling": dict(SCALING), "rope_theta": 10000.0} if trigger else {}
    model = build(LlamaForCausalLM, small_config(LlamaConfig, head_dim=8, **extra))
    if side == "buggy":
        rotary = model.model.rotary_emb
        dim = rotary.inv_freq.numel() * 2
        vanilla = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        rotary.inv_freq.copy_(vanilla)
        rotary.attention_scaling = 1.0
    train(out, model)


if __name__ == "__main__":
    main(record)
