"""The Trainer counted the tokens of a step (``num_items_in_batch``, the loss's denominator)
over every label position, while the causal-LM loss shifts the labels and never predicts
position 0: the denominator was too large by one per row, every loss and gradient slightly
under-scaled (transformers PR #46204, "Fix num_items_in_batch over-counting for causal LM
losses").

Buggy side, a re-implementation quoting the fix: ``Trainer._get_num_items_in_batch`` counts
``batch["labels"]`` instead of ``batch["labels"][..., 1:]`` (``trainer._loss_shifts_labels =
False`` takes that branch of the fixed code). User path: a Trainer fine-tune recorded with
``PrecalignCallback`` (scalars). Twin: the same rows with each row's first label already
-100 (a prompt token), where both counts agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _tiny import main, pad_batch, tiny_qwen2
from _trainer import finetune


def first_label_ignored(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    batch = pad_batch(features)
    batch["labels"][:, 0] = -100  # the prompt's first token is never a target: both counts agree
    return batch


def record(out: Path, side: str, trigger: bool) -> None:
    def setup(trainer: Any) -> None:
        if side == "buggy":
            trainer._loss_shifts_labels = False

    finetune(out, tiny_qwen2(), setup=setup, collator=pad_batch if trigger else first_label_ignored)


if __name__ == "__main__":
    main(record)
