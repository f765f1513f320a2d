"""A user's ``transformers.Trainer`` fine-tune recorded with ``PrecalignCallback`` (the shape
of ``example_suites/recorded_runs/trainer_finetune.py``): a tiny model, rows of 6-16 tokens
padded per micro-batch, warmup 2 + linear decay, ``max_grad_norm`` 1.0, weight decay 0.1,
6 optimizer steps of 2 micro-batches of 2 rows. A case changes what it is about through the
keyword arguments (``trainer_cls`` for a Trainer subclass, ``setup`` for the built Trainer)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from _tiny import QUIET_CPU_RUN, pad_batch, token_rows

from pytest_precalign import PrecalignCallback


def finetune(
    out: Path,
    model: Any,
    *,
    steps: int = 6,
    per_device: int = 2,
    accumulation: int = 2,
    weight_decay: float = 0.1,
    rows: list[list[int]] | None = None,
    collator: Callable[..., Any] = pad_batch,
    mode: str = "scalars",
    record_steps: list[int] | None = None,
    trainer_cls: Any = None,
    setup: Callable[[Any], None] | None = None,
    **arguments: Any,
) -> None:
    from transformers import Trainer, TrainingArguments

    rows = token_rows(steps * per_device * accumulation) if rows is None else rows
    args = TrainingArguments(
        output_dir=str(out.with_name(out.name + "_trainer")),
        max_steps=steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        learning_rate=5e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=weight_decay,
        max_grad_norm=1.0,
        **{"train_sampling_strategy": "sequential", **QUIET_CPU_RUN, **arguments}
        if _has_sampling_strategy()
        else {**QUIET_CPU_RUN, **arguments},
    )
    trainer = (trainer_cls or Trainer)(
        model=model,
        args=args,
        train_dataset=[{"input_ids": row} for row in rows],
        data_collator=collator,
        callbacks=[PrecalignCallback(out, mode=mode, steps=record_steps)],
    )
    if setup is not None:
        setup(trainer)
    if not _has_sampling_strategy():  # releases before the argument: sequential by hand
        import torch

        trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    trainer.train()


def _has_sampling_strategy() -> bool:
    import dataclasses

    from transformers import TrainingArguments

    return any(f.name == "train_sampling_strategy" for f in dataclasses.fields(TrainingArguments))
