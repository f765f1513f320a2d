"""The Trainer counted the tokens of a step (``num_items_in_batch``, the loss's denominator)
over every label position, while the causal-LM loss shifts the labels and never predicts
position 0: the denominator was too large by one per row, every loss and gradient slightly
under-scaled (transformers PR #46204, "Fix num_items_in_batch over-counting for causal LM
losses").

Buggy and fixed releases from the registry: transformers 5.10.0 and 5.10.1 (each beside
accelerate 1.15.0), each in its own venv, the same script. ``Trainer._get_num_items_in_batch``
in 5.10.0 and 5.10.1 (read from the wheels, ``trainer.py``)::

    -                num_items_in_batch = sum((batch["labels"].ne(-100)).sum() for batch in batch_samples)
    +                # Causal LM losses shift labels; count over `labels[..., 1:]` to avoid over-counting position 0.
    +                labels_for_count = [
    +                    batch["shift_labels"]
    +                    if "shift_labels" in batch
    +                    else batch["labels"][..., 1:]
    +                    if self._loss_shifts_labels
    +                    else batch["labels"]
    +                    for batch in batch_samples
    +                ]
    +                num_items_in_batch = sum(labels.ne(-100).sum() for labels in labels_for_count)
    (and in Trainer.__init__)
    +        self._loss_shifts_labels = LOSS_MAPPING.get(getattr(model_to_inspect, "loss_type", None)) is ForCausalLMLoss

User path: a Trainer fine-tune of a tiny Qwen2 (its ``loss_type`` maps to ``ForCausalLMLoss``)
recorded with ``PrecalignCallback`` (scalars). Twin: the same upgrade on the same rows with each
row's first label already -100 (a prompt token), where both counts agree."""

from __future__ import annotations

from pathlib import Path

import torch
from _tiny import main, pad_batch, tiny_qwen2
from _trainer import finetune


def first_label_ignored(features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    batch = pad_batch(features)
    batch["labels"][:, 0] = -100  # the prompt's first token is never a target: both counts agree
    return batch


def record(out: Path, side: str, trigger: bool) -> None:
    finetune(out, tiny_qwen2(), collator=pad_batch if trigger else first_label_ignored)


if __name__ == "__main__":
    main(record)
