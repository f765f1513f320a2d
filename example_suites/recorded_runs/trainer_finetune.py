"""A user's fine-tune sweep: a tiny Qwen2 trained by ``transformers.Trainer`` and recorded
with ``PrecalignCallback`` (nothing downloaded: the config is built here, the data is made
here from a fixed seed).

    python trainer_finetune.py OUT RUN [RUN ...]

Each RUN is ``NAME`` or ``NAME:key=value,key=value`` and is recorded under ``OUT/NAME``.
Keys (a run is the baseline unless one of them changes it):

- recording: ``mode`` (scalars | stats | tensor | hash; default scalars), ``steps`` (the
  steps whose layers are recorded, ``3+4``; default every step), ``format`` (native | msprobe)
- settings: ``scheduler`` (cosine | linear ...), ``lr`` (peak LR), ``warmup`` (steps, 2),
  ``weight_decay`` (0.1), ``attn`` (eager | sdpa), ``micro`` (rows per micro-batch x
  micro-batches: ``2x2`` default, ``4x1``)
- faults from an optimizer step k (0-based, the Trainer logs it as step k + 1):
  ``clip_from=k`` (max_grad_norm set to 0.05 from step k), ``shuffle_from=k`` (the rows of
  steps k.. in another order), ``layer_bug_from=k`` (model.layers.1.mlp's output x 1.2),
  ``attn_bug_from=k`` (model.layers.0.self_attn's output x 1.2), ``lr_bump_from=k`` (the
  optimizer's LR x 1.1 from step k, behind the scheduler's back)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from tiny_setup import QUIET_CPU_RUN, pad_batch, sweep, tiny_qwen2, token_rows
from transformers import Trainer, TrainerCallback, TrainingArguments

from pytest_precalign import PrecalignCallback

STEPS = 10  # optimizer steps
ROWS = 4  # rows per optimizer step
BASELINE: dict[str, Any] = {
    "mode": "scalars",
    "steps": None,
    "format": "native",
    "scheduler": "cosine",
    "lr": 5e-3,
    "warmup": 2,
    "weight_decay": 0.1,
    "attn": "eager",
    "micro": "2x2",
    "clip_from": None,
    "shuffle_from": None,
    "layer_bug_from": None,
    "attn_bug_from": None,
    "lr_bump_from": None,
}


class StepCounter(TrainerCallback):
    """The optimizer step now running (0-based), for the faults below."""

    def __init__(self) -> None:
        self.step = 0

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        self.step = state.global_step


class ClipFrom(TrainerCallback):
    """A fault: a much lower clip threshold from step k on (e.g. a config reloaded mid-run)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.k:
            args.max_grad_norm = 0.05


class LrBumpFrom(TrainerCallback):
    """A fault: every group's LR x 1.1 from step k (the scheduler sets it again each step)."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_begin(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.k:
            for group in kwargs["optimizer"].param_groups:
                group["lr"] *= 1.1


def layer_bug(module: torch.nn.Module, counter: StepCounter, k: int) -> None:
    """A fault: ``module``'s output (its first output, for attention) x 1.2 from step k."""

    def scale(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if counter.step < k:
            return None
        if isinstance(output, tuple):
            return (output[0] * 1.2, *output[1:])
        return output * 1.2

    module.register_forward_hook(scale)


def train(out: Path, run: dict[str, Any]) -> None:
    per_device, accumulation = (int(n) for n in run["micro"].split("x"))
    counter = StepCounter()
    shuffle = None if run["shuffle_from"] is None else run["shuffle_from"] * ROWS
    model = tiny_qwen2(run["attn"])
    if run["layer_bug_from"] is not None:
        layer_bug(model.model.layers[1].mlp, counter, run["layer_bug_from"])
    if run["attn_bug_from"] is not None:
        layer_bug(model.model.layers[0].self_attn, counter, run["attn_bug_from"])
    callbacks: list[TrainerCallback] = [counter]
    if run["clip_from"] is not None:
        callbacks.append(ClipFrom(run["clip_from"]))
    if run["lr_bump_from"] is not None:
        callbacks.append(LrBumpFrom(run["lr_bump_from"]))
    callbacks.append(PrecalignCallback(out, mode=run["mode"], steps=run["steps"], format=run["format"]))
    args = TrainingArguments(
        output_dir=str(out.with_name(out.name + "_trainer")),
        max_steps=STEPS,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        learning_rate=run["lr"],
        lr_scheduler_type=run["scheduler"],
        warmup_steps=run["warmup"],
        weight_decay=run["weight_decay"],
        max_grad_norm=1.0,
        **QUIET_CPU_RUN,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=[{"input_ids": row} for row in token_rows(STEPS * ROWS, permute_after=shuffle)],
        data_collator=pad_batch,
        callbacks=callbacks,
    )
    trainer.train()


if __name__ == "__main__":
    sweep(sys.argv[1:], BASELINE, train, __doc__ or "")
