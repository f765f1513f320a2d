"""Gemma was trained with the tanh approximation of GELU, but its config said ``hidden_act:
"gelu"`` and transformers ran the exact GELU (transformers PR #29402, "[Gemma] Fix the
activation function": ``hidden_activation`` defaults to ``gelu_pytorch_tanh`` and the exact
``gelu`` of older configs is replaced by it with a warning).

Buggy side, a re-implementation: the MLP's activation is the exact GELU
(``torch.nn.GELU()``, what ``hidden_act="gelu"`` gave before the fix). User path: the user's
own fine-tune loop recorded with ``Recorder`` (stats). Twin: a rerun of the fixed model on
both sides with the activation set explicitly to the tanh approximation on the buggy side
(the same function: the fix's path). Weights at ``initializer_range=0.5`` so that the
MLP's inputs are O(1), as in a trained checkpoint (at 0.02 they are ~1e-2, where the two
functions agree to 1e-7)."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import build, main, small_config


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    model = build(
        GemmaForCausalLM,
        small_config(GemmaConfig, head_dim=8, hidden_activation="gelu_pytorch_tanh", initializer_range=0.5),
    )
    if side == "buggy":
        for layer in model.model.layers:
            layer.mlp.act_fn = torch.nn.GELU() if trigger else torch.nn.GELU(approximate="tanh")
    train(out, model)


if __name__ == "__main__":
    main(record)
