"""The ``llm`` run of ``lightning_run.py`` trained by a ``transformers.Trainer`` instead and
recorded with ``PrecalignCallback`` (the same model, rows in the same order, AdamW with weight
decay 0.1 on the Trainer's decay parameters, constant LR, clipping at 1.0):

    python trainer_run.py OUT.json ROOT [--accumulate 1] [--steps 4]
"""

from __future__ import annotations

import argparse
import json

from lightning_run import ROWS, tiny_model, token_ids
from transformers import Trainer, TrainingArguments

from pytest_precalign import PrecalignCallback


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("root")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    rows = [{"input_ids": r, "labels": r.clone()} for r in token_ids(args.steps * args.accumulate * ROWS)]
    arguments = TrainingArguments(
        output_dir=f"{args.root}-trainer",
        max_steps=args.steps,
        per_device_train_batch_size=ROWS,
        gradient_accumulation_steps=args.accumulate,
        learning_rate=0.01,
        weight_decay=0.1,
        max_grad_norm=1.0,
        lr_scheduler_type="constant",
        train_sampling_strategy="sequential",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    callback = PrecalignCallback(args.root, mode="stats")
    Trainer(model=tiny_model("llm"), args=arguments, train_dataset=rows, callbacks=[callback]).train()
    with open(args.out, "w") as f:
        json.dump({"steps": len(callback.written)}, f)


if __name__ == "__main__":
    main()
