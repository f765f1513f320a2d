"""A user's ``transformers.Trainer`` fine-tune recorded with ``PrecalignCallback`` (run as a
script: ``python recorded_trainer.py OUT [VARIANT ...]``): a tiny Qwen2 (seed 0), 6 optimizer
steps of 2 micro-batches, AdamW with weight decay, clipping, 2 warmup steps then a cosine
decay. Variants: ``base`` and ``rerun`` (the same run twice), ``linear`` (a linear decay: the
LR differs from step 3 on; at step 2, the decay's start, both are at the peak). Each is
recorded into ``OUT/<variant>-<recording>/`` as ``scalars-native`` (the callback's default),
``step3-native`` and ``step3-msprobe`` (every layer on step 3 only) and ``every-native``
(every layer on every step); the rerun only as ``scalars-native``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Trainer, TrainingArguments

from pytest_precalign import PrecalignCallback

STEPS, ROWS, MICRO, FAULT_STEP = 6, 4, 2, 3
RECORDINGS: dict[str, dict[str, Any]] = {
    "scalars-native": {},
    "step3-native": {"mode": "stats", "steps": [FAULT_STEP]},
    "step3-msprobe": {"mode": "stats", "steps": [FAULT_STEP], "format": "msprobe"},
    "every-native": {"mode": "stats"},
}
VARIANTS = {"base": tuple(RECORDINGS), "rerun": ("scalars-native",), "linear": tuple(RECORDINGS)}


def model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    config._attn_implementation = "eager"
    return Qwen2ForCausalLM(config)


def rows() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 64, (STEPS * ROWS, 8), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def train(out: Path, variant: str, recording: dict[str, Any]) -> None:
    args = TrainingArguments(
        output_dir=str(out.with_name(out.name + ".trainer")),
        max_steps=STEPS,
        per_device_train_batch_size=ROWS // MICRO,
        gradient_accumulation_steps=MICRO,
        learning_rate=0.01,
        weight_decay=0.1,
        max_grad_norm=1.0,
        warmup_steps=FAULT_STEP - 1,
        lr_scheduler_type="linear" if variant == "linear" else "cosine",
        train_sampling_strategy="sequential",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    callback = PrecalignCallback(out, **recording)
    Trainer(model=model(), args=args, train_dataset=rows(), callbacks=[callback]).train()


def main(out: Path, variants: list[str]) -> None:
    for variant in variants or VARIANTS:
        for name in VARIANTS[variant]:
            train(out / f"{variant}-{name}", variant, RECORDINGS[name])


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
