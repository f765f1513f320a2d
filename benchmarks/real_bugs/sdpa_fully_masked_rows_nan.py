"""Attention over a row whose keys are all masked gave NaN (softmax of all ``-inf``), and the
NaN of left-padded positions spread through ``0 * NaN`` into every later token: torch's SDPA
now zeroes fully masked rows (pytorch PR #131060, "Add a private _safe_softmax", and
PR #133882 calling it from SDPA; the reports are pytorch issues #41508 and #103749).

Buggy side, a re-implementation: the model's attention is an SDPA-shaped function whose
softmax is the plain one (what SDPA's math path did before ``_safe_softmax``), registered
with ``AttentionInterface`` and selected as the model's attention. The rows are left-padded
with a boolean mask that masks padded queries fully. User path: the user's own fine-tune
loop recorded with ``Recorder`` (stats). Twin: the same rows without padding (every row the
same length), where no row is fully masked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _loop import train
from _tiny import main, pad_batch, tiny_qwen2, token_rows


def plain_softmax_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(-1, -2) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    length = query.shape[-2]
    causal = torch.ones(length, key.shape[-2], dtype=torch.bool).tril()
    allowed = causal if attention_mask is None else attention_mask.bool() & causal
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ value  # no _safe_softmax: a fully masked row is NaN
    return out.transpose(1, 2).contiguous(), None


def padded_queries_masked(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    return pad_batch(features, left=True)


def record(out: Path, side: str, trigger: bool) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register("plain_softmax", plain_softmax_attention)
    model = tiny_qwen2(attn="sdpa")
    if side == "buggy":
        model.set_attn_implementation("plain_softmax")
    rows = token_rows(16) if trigger else token_rows(16, 10, 10)
    train(out, model, rows=rows, collate=padded_queries_masked)


if __name__ == "__main__":
    main(record)
