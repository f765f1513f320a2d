"""Gemma scales its embeddings by ``sqrt(hidden_size)``; the original implementation rounds
that normaliser to the activations' dtype first, transformers multiplied by the exact
Python float, so a bf16 model's embeddings came out scaled differently (transformers PR
#29402: ``normalizer = torch.tensor(self.config.hidden_size**0.5, dtype=hidden_states.dtype)``).

Buggy and fixed releases from the registry: transformers 4.38.2 (``hidden_states *
(self.config.hidden_size**0.5)``) and 4.39.0 (the normaliser rounded to the dtype), each in its
own venv, the same script. A bf16 Gemma with hidden size 48 (sqrt 6.928 rounds to 6.9375 in
bf16), the tanh GELU named explicitly, norm weights at a fresh init's zeros (where the
release's RMSNorm fix changes no forward). The normaliser is applied in ``GemmaModel.forward``
to the output of ``embed_tokens``, so the first record that differs is the first decoder layer's
input (``model.layers.0``, its ``input_layernorm`` first). User path: the user's own bf16
fine-tune loop recorded with ``Recorder`` (stats). Twin: the same upgrade in fp32 (the
normaliser is exact enough either way)."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import logits_loss, train
from _tiny import build, main, small_config


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    dtype = torch.bfloat16 if trigger else torch.float32
    config = small_config(
        GemmaConfig, hidden_size=48, head_dim=12, initializer_range=0.5, hidden_act="gelu_pytorch_tanh"
    )
    model = build(GemmaForCausalLM, config).to(dtype)
    train(out, model, loss=logits_loss, precision="bfloat16" if trigger else None)


if __name__ == "__main__":
    main(record)
