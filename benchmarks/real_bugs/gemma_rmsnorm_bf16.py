"""Gemma's RMSNorm cast the normalised activations to bf16 before multiplying by
``(1 + weight)`` (Llama's order), where the reference multiplies in fp32 and casts once
(transformers PR #29402: "Llama does x.to(float16) * w whilst Gemma is (x * w).to(float16)").

Buggy and fixed releases from the registry: transformers 4.38.2 (``GemmaRMSNorm.forward``
returns ``self._norm(x.float()).type_as(x) * (1 + self.weight)``) and 4.39.0
(``(output * (1.0 + self.weight.float())).type_as(x)``), each in its own venv, the same
script. A bf16 Gemma with hidden size 64 (its embedding normaliser ``sqrt(64) = 8`` is exact
in bf16, so the release's other Gemma fix, ``gemma_normalizer_dtype``, cannot fire), the tanh
GELU named explicitly (nor can ``gemma_gelu_tanh``), and norm weights as a trained checkpoint
has them (not the zeros of a fresh init). User path: the user's own bf16 fine-tune loop
recorded with ``Recorder`` (stats). Twin: the same upgrade in fp32, where the two orders
round alike."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import logits_loss, train
from _tiny import build, main, small_config


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM

    dtype = torch.bfloat16 if trigger else torch.float32
    config = small_config(GemmaConfig, hidden_size=64, head_dim=16, hidden_act="gelu_pytorch_tanh")
    model = build(GemmaForCausalLM, config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    train(out, model.to(dtype), loss=logits_loss, precision="bfloat16" if trigger else None)


if __name__ == "__main__":
    main(record)
