"""The Trainer's gradient accumulation normalised each micro-batch's loss by its own token
count and then divided by the accumulation steps (a mean of micro-batch means), so padded
rows of different lengths weighed wrongly (transformers PR #34191, "Fix Gradient Accumulation
issue", released in 4.46.0; follow-up transformers issue #37766 for models without loss
kwargs).

Buggy side, a re-implementation: ``trainer.model_accepts_loss_kwargs = False``, the path the
Trainer took for every model before the fix (the loss averaged per micro-batch, then divided
by ``gradient_accumulation_steps``; the fix passes ``num_items_in_batch`` to the model's loss).
User path: a Trainer fine-tune recorded with ``PrecalignCallback`` (scalars). Twin: one
micro-batch per step (``gradient_accumulation_steps=1``), where both normalisations agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _tiny import main, tiny_qwen2
from _trainer import finetune


def record(out: Path, side: str, trigger: bool) -> None:
    def setup(trainer: Any) -> None:
        if side == "buggy":
            trainer.model_accepts_loss_kwargs = False

    if trigger:
        finetune(out, tiny_qwen2(), setup=setup)
    else:
        finetune(out, tiny_qwen2(), per_device=4, accumulation=1, setup=setup)


if __name__ == "__main__":
    main(record)
