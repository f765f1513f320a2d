"""A user's ``transformers.Trainer`` run recorded with ``PrecalignCallback``, run as a script by
``test_run_roots.py``:

    python resume_run.py ROOT [--resume CHECKPOINT] [--twice] [--steps 4] [--overwrite]
        [--nan-at STEP] [--select STEP...] [--stop-after STEP] [--unrecorded]

A tiny causal LM (fixed seed, nothing downloaded), 4 optimizer steps of 2 rows, a checkpoint
every 2 steps into ``ROOT.out``. ``--resume``: resumed from that checkpoint (the usual way:
the same callback, the same root); ``--twice``: the callback added twice on one root;
``--nan-at STEP``: that step's loss is NaN (the model's forward returns NaN there);
``--stop-after N``: the run stops after N optimizer steps (``control.should_training_stop``,
as a job that runs out of time does), its checkpoint at step N saved; ``--unrecorded``: no
``PrecalignCallback`` (a run recorded only once resumed).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from pytest_precalign import PrecalignCallback
from tests.helpers.tiny_lm import tiny_causal_lm


class StopAfter(TrainerCallback):
    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step >= self.steps:
            control.should_training_stop = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--resume")
    parser.add_argument("--twice", action="store_true")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--nan-at", type=int)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--unrecorded", action="store_true")
    parser.add_argument("--select", type=int, nargs="*", help="PrecalignCallback(steps=...), mode stats")
    options = parser.parse_args()

    torch.manual_seed(0)
    model = tiny_causal_lm(vocab=64, hidden=16, layers=1)
    if options.nan_at is not None:
        calls = {"n": 0}

        def poison(module: Any, args: Any, output: Any) -> Any:
            if module.training and torch.is_grad_enabled():
                calls["n"] += 1
                if calls["n"] == options.nan_at + 1:  # one micro-batch per step
                    output.loss = output.loss * float("nan")
            return output

        model.register_forward_hook(poison)
    ids = torch.randint(0, 64, (8, 6), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(
        output_dir=f"{options.root}.out",
        max_steps=options.steps,
        per_device_train_batch_size=2,
        learning_rate=0.01,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    selected: dict[str, Any] = {"mode": "stats", "steps": options.select} if options.select else {}
    callbacks: list[Any] = [PrecalignCallback(options.root, overwrite=options.overwrite, **selected)]
    if options.unrecorded:
        callbacks = []
    if options.twice:
        callbacks.append(PrecalignCallback(options.root))
    if options.stop_after is not None:
        callbacks.append(StopAfter(options.stop_after))
    trainer = Trainer(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=options.resume)


if __name__ == "__main__":
    main()
