"""The Trainer's gradient accumulation normalised each micro-batch's loss by its own token
count and then divided by the accumulation steps (a mean of micro-batch means), so padded
rows of different lengths weighed wrongly (transformers PR #34191, "Fix Gradient Accumulation
issue", released in 4.46.0; follow-up transformers issue #37766 for models without loss
kwargs).

Buggy and fixed releases from the registry: transformers 4.45.2 (``training_step`` divides the
model's mean loss by ``gradient_accumulation_steps``) and 4.46.0 (the first that counts the
step's tokens and passes ``num_items_in_batch`` to a model taking loss kwargs), each in its own
venv, the same script. User path: a Trainer fine-tune recorded with ``PrecalignCallback``
(scalars). Twin: the same upgrade with one micro-batch per step
(``gradient_accumulation_steps=1``), where both normalisations agree."""

from __future__ import annotations

from pathlib import Path

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    if trigger:
        finetune(out, tiny_qwen2())
    else:
        finetune(out, tiny_qwen2(), per_device=4, accumulation=1)


if __name__ == "__main__":
    main(record)
