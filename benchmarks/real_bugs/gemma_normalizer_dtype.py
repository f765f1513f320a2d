"""Gemma scales its embeddings by ``sqrt(hidden_size)``; the original implementation rounds
that normaliser to the activations' dtype first, transformers multiplied by the exact
Python float, so a bf16 model's embeddings came out scaled differently (transformers PR
#29402: ``normalizer = torch.tensor(self.config.hidden_size**0.5, dtype=hidden_states.dtype)``).

Buggy side, a re-implementation quoting the fix's diff: the embedding output multiplied by
``hidden_size ** 0.5`` as a Python float. A bf16 Gemma with hidden size 48 (sqrt 6.928 rounds
to 6.9375 in bf16). User path: the user's own bf16 fine-tune loop recorded with ``Recorder``
(stats). Twin: the same model in fp32 (the normaliser is exact enough either way)."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import build, main, small_config


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    dtype = torch.bfloat16 if trigger else torch.float32
    config = small_config(GemmaConfig, hidden_size=48, head_dim=12, initializer_range=0.5)
    model = build(GemmaForCausalLM, config).to(dtype)
    if side == "buggy":
        embed = model.model.embed_tokens

        def unrounded(input_ids: torch.Tensor) -> torch.Tensor:  # the exact Python float, not rounded
            return torch.nn.Embedding.forward(embed, input_ids) * embed.scalar_embed_scale

        embed.forward = unrounded
    train(out, model, precision="bfloat16" if trigger else None)


if __name__ == "__main__":
    main(record)
