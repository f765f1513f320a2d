"""A user's LoRA fine-tune with TRL: ``SFTTrainer`` + a PEFT ``LoraConfig`` on a tiny Qwen2,
recorded with ``PrecalignCallback`` (nothing downloaded: the config, the tokenizer's
vocabulary and the data are made here from fixed seeds).

    python sft_lora.py OUT RUN [RUN ...]

Each RUN is ``NAME`` or ``NAME:key=value,key=value``, recorded under ``OUT/NAME``. Keys:
``mode`` (scalars | stats ...; default scalars), ``steps`` (``3+4``), ``format`` (native |
msprobe), ``lora_alpha`` (default 16), ``bf16`` (on | off; default off: SFTConfig's own
default is on, also on CPU), ``micro`` (``2x2`` default, ``4x1``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from datasets import Dataset
from peft import LoraConfig
from tiny_setup import EOS, PAD, QUIET_CPU_RUN, VOCAB, sweep, tiny_qwen2, token_rows
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from pytest_precalign import PrecalignCallback

STEPS, ROWS = 8, 4
BASELINE: dict[str, Any] = {
    "mode": "scalars",
    "steps": None,
    "format": "native",
    "lora_alpha": 16,
    "bf16": "off",
    "micro": "2x2",
}


def tokenizer() -> PreTrainedTokenizerFast:
    """A word-level vocabulary t0..t255 (t0 pads, t1 ends a row): SFTTrainer wants a tokenizer."""
    vocab = {f"t{i}": i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")),
        pad_token=f"t{PAD}",
        eos_token=f"t{EOS}",
        unk_token="t2",
    )


def sft_rows() -> Dataset:
    """STEPS x ROWS pre-tokenized rows, each ending with the eos token."""
    return Dataset.from_dict({"input_ids": [[*row, EOS] for row in token_rows(STEPS * ROWS)]})


def train(out: Path, run: dict[str, Any]) -> None:
    per_device, accumulation = (int(n) for n in run["micro"].split("x"))
    args = SFTConfig(
        output_dir=str(out.with_name(out.name + "_trainer")),
        max_steps=STEPS,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        learning_rate=5e-3,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        bf16=run["bf16"] == "on",
        **QUIET_CPU_RUN,
    )
    lora = LoraConfig(
        r=4,
        lora_alpha=int(run["lora_alpha"]),
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj"],
        task_type="CAUSAL_LM",
    )
    trainer = SFTTrainer(
        model=tiny_qwen2(),
        args=args,
        train_dataset=sft_rows(),
        processing_class=tokenizer(),
        peft_config=lora,
        callbacks=[PrecalignCallback(out, mode=run["mode"], steps=run["steps"], format=run["format"])],
    )
    trainer.train()


if __name__ == "__main__":
    sweep(sys.argv[1:], BASELINE, train, __doc__ or "")
