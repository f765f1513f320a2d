"""Gemma was trained with the tanh approximation of GELU, but its checkpoints' config said
``hidden_act: "gelu"`` and transformers ran the exact GELU (transformers PR #29402, "[Gemma]
Fix the activation function": ``GemmaMLP`` takes ``config.hidden_activation``, and when a
config has none, ``gelu_pytorch_tanh`` whatever ``hidden_act`` says, with a warning).

Buggy and fixed releases from the registry: transformers 4.38.2 (the last that ran
``ACT2FN[config.hidden_act]``) and 4.39.0 (the first with the fix), each in its own venv, the
same script: a Gemma config as the checkpoints shipped it (``hidden_act="gelu"``). User path:
the user's own fine-tune loop recorded with ``Recorder`` (stats; the loss from the logits:
4.38's ``forward`` takes no ``num_items_in_batch``). Twin: the same upgrade with
``hidden_act="gelu_pytorch_tanh"`` (both releases run the tanh GELU). Weights at
``initializer_range=0.5`` so that the MLP's inputs are O(1), as in a trained checkpoint (at
0.02 they are ~1e-2, where the two functions agree to 1e-7)."""

from __future__ import annotations

from pathlib import Path

from _loop import logits_loss, train
from _tiny import build, main, small_config


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    act = "gelu" if trigger else "gelu_pytorch_tanh"
    model = build(
        GemmaForCausalLM, small_config(GemmaConfig, head_dim=8, hidden_act=act, initializer_range=0.5)
    )
    train(out, model, loss=logits_loss)


if __name__ == "__main__":
    main(record)
