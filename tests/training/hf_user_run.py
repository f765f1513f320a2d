"""A user's own fine-tune recorded with ``PrecalignCallback``, run as a script in a subprocess:
a ``transformers.Trainer`` run (``--trainer hf``) or a TRL ``SFTTrainer`` + PEFT LoRA run
(``--trainer sft``) of a tiny Qwen2 built from a config with a fixed seed (nothing downloaded).

    python hf_user_run.py ROOT NAME="[--trainer hf|sft] [--scheduler cosine] [--bf16 0|1]
        [--alpha 8] [--touch-frozen STEP] [--no-callback]" ...

Each run NAME writes its recording to ``ROOT/NAME/rec`` and the Trainer's logged loss /
learning_rate / grad_norm per step to ``ROOT/NAME/logs.json`` (under torchrun, DDP over gloo:
``logs.rank<R>.json``). ``--touch-frozen STEP``: a bug that changes a frozen base weight
after optimizer step STEP.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from pytest_precalign import PrecalignCallback
from tests.helpers.tiny_lm import tiny_causal_lm

STEPS, ROWS, MICRO, LENGTH = 5, 4, 2, 8
FROZEN_TOUCHED = "model.layers.0.self_attn.k_proj.weight"


def model() -> Any:
    return tiny_causal_lm(vocab=128, hidden=32, layers=2)


def rows() -> list[list[int]]:
    ids = torch.randint(0, 128, (STEPS * ROWS, LENGTH), generator=torch.Generator().manual_seed(1))
    return [row.tolist() for row in ids]


class TouchFrozen(TrainerCallback):
    """A bug: a frozen base weight changes after optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            for name, param in kwargs["model"].named_parameters():
                if name.endswith(FROZEN_TOUCHED.removeprefix("model.")) and not param.requires_grad:
                    with torch.no_grad():
                        param.add_(1e-2)


def common(out: Path, options: argparse.Namespace) -> dict[str, Any]:
    """The run's ``TrainingArguments``, those this transformers release knows (4.x has no
    ``train_sampling_strategy``: its sampler is seeded, which a recording does not change)."""
    known = {f.name for f in dataclasses.fields(TrainingArguments)}
    given = {
        "output_dir": str(out / "trainer"),
        "max_steps": STEPS,
        "per_device_train_batch_size": ROWS // MICRO,
        "gradient_accumulation_steps": MICRO,
        "learning_rate": 0.01,
        "weight_decay": options.weight_decay,
        "max_grad_norm": 1.0,
        "warmup_steps": 1,
        "lr_scheduler_type": options.scheduler,
        "bf16": bool(options.bf16),
        "train_sampling_strategy": "sequential",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "disable_tqdm": True,
        "use_cpu": True,
        "seed": 0,
    }
    return {key: value for key, value in given.items() if key in known}


def train(out: Path, options: argparse.Namespace) -> Trainer:
    callbacks: list[Any] = []
    if options.callback:
        callbacks.append(PrecalignCallback(out / "rec", mode=options.mode))
    if options.touch_frozen is not None:
        callbacks.append(TouchFrozen(options.touch_frozen))
    if options.trainer == "hf":
        data = [{"input_ids": torch.tensor(r), "labels": torch.tensor(r)} for r in rows()]
        args = TrainingArguments(**common(out, options))
        return Trainer(model=model(), args=args, train_dataset=data, callbacks=callbacks)
    from datasets import Dataset
    from peft import LoraConfig
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    vocab = {f"t{i}": i for i in range(128)}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), pad_token="t0", eos_token="t1"
    )
    config = {k: v for k, v in common(out, options).items() if k != "bf16"}
    if options.bf16 is not None:
        config["bf16"] = bool(options.bf16)  # else SFTConfig's own default (bf16=True)
    lora = LoraConfig(r=4, lora_alpha=options.alpha, target_modules=["q_proj", "v_proj"])
    return SFTTrainer(
        model=model(),
        args=SFTConfig(**config),
        train_dataset=Dataset.from_list([{"input_ids": r} for r in rows()]),
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=callbacks,
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=("hf", "sft"), default="hf")
    parser.add_argument("--scheduler", default="cosine")
    parser.add_argument("--bf16", type=int, default=None)
    parser.add_argument("--alpha", type=int, default=8)
    parser.add_argument("--mode", default="stats")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--touch-frozen", type=int, default=None)
    parser.add_argument("--no-callback", dest="callback", action="store_false")
    return parser


def main(argv: list[str]) -> None:
    """``ROOT NAME=OPTIONS...``: each run ``NAME`` (its options space-separated) into ``ROOT/NAME``,
    one after the other in this process (the imports are most of a tiny run's time)."""
    torch.use_deterministic_algorithms(True)
    root = Path(argv[0])
    for spec in argv[1:]:
        name, _, given = spec.partition("=")
        options = parser().parse_args(given.split())
        out = root / name
        out.mkdir(parents=True, exist_ok=True)
        trainer = train(out, options)
        trainer.train()
        keys = ("loss", "learning_rate", "grad_norm")
        logs = [[entry[k] for k in keys] for entry in trainer.state.log_history if "loss" in entry]
        rank = os.environ.get("RANK")  # under torchrun (DDP over gloo): one file per rank
        (out / ("logs.json" if rank is None else f"logs.rank{rank}.json")).write_text(json.dumps(logs))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
