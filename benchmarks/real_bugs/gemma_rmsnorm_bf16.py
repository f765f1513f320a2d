"""Gemma's RMSNorm cast the normalised activations to bf16 before multiplying by
``(1 + weight)`` (Llama's order), where the reference multiplies in fp32 and casts once
(transformers PR #29402: "Llama does x.to(float16) * w whilst Gemma is (x * w).to(float16)").

Buggy side, a re-implementation quoting the fix's comment: ``GemmaRMSNorm.forward`` returns
``output.type_as(x) * (1.0 + self.weight)`` (two roundings) instead of
``(output * (1.0 + self.weight.float())).type_as(x)``. The model is bf16 with norm weights
as a trained checkpoint has them (not the zeros of a fresh init). User path: the user's own
bf16 fine-tune loop recorded with ``Recorder`` (stats). Twin: the same model in fp32, where
the two orders round alike."""

from __future__ import annotations

from pathlib import Path

import torch
from _loop import train
from _tiny import build, main, small_config


def buggy_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    output = self._norm(x.float())
    return output.type_as(x) * (1.0 + self.weight)


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import GemmaConfig, GemmaForCausalLM
    from transformers.models.gemma import modeling_gemma

    if side == "buggy":
        modeling_gemma.GemmaRMSNorm.forward = buggy_forward
    dtype = torch.bfloat16 if trigger else torch.float32
    model = build(GemmaForCausalLM, small_config(GemmaConfig, head_dim=8), dtype=torch.float32)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    train(out, model.to(dtype), precision="bfloat16" if trigger else None)


if __name__ == "__main__":
    main(record)
