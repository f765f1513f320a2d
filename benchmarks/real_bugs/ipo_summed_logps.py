"""TRL's IPO loss used the summed log-probabilities of each completion, which makes its
regularisation depend on the completion's length; the IPO authors' loss averages them over
the completion's tokens (trl PR #1265, "[DPO] average_log_prob when loss is IPO"; the
discussion is trl issues #1294 and #1677).

Buggy and fixed releases from the registry: trl 0.7.10 and 0.7.11, each beside transformers
4.38.2 and accelerate 0.27.2 (trl 0.7.x imports ``transformers.top_k_top_p_filtering``,
removed in transformers 4.39), each in its own venv, the same script. The fix, in
``DPOTrainer.concatenated_forward`` (read from the wheels, ``trl/trainer/dpo_trainer.py``)::

         all_logps = self.get_batch_logps(
             all_logits,
             concatenated_batch["concatenated_labels"],
    -        average_log_prob=False,
    +        average_log_prob=self.loss_type == "ipo",

User path: TRL's ``DPOTrainer`` with ``loss_type="ipo"`` on a tiny Qwen2 built from a config
(fixed seed; the reference model is the trainer's own copy of it), a word-level tokenizer
built in code (nothing downloaded), prompts of 4-6 words and completions of 3-6, 2
micro-batches of 2 pairs a step, recorded with ``PrecalignCallback`` (stats). At step 0 the
policy is its reference, so both releases' IPO loss is ``(0 - 1/(2 beta))^2``: the loss
value matches and the length factor enters through its gradient (the backward). Twin: the
same upgrade with DPO's default loss (``loss_type="sigmoid"``), summed on both releases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _tiny import EOS, PAD, QUIET_CPU_RUN, VOCAB, main, tiny_qwen2, token_rows

from pytest_precalign import PrecalignCallback

STEPS, PER_DEVICE, ACCUMULATION = 4, 2, 2


def word_tokenizer() -> Any:
    """A word-level tokenizer over the tiny model's vocabulary (``t2`` .. ``t255``), built in
    code: token ``tN`` is id N, PAD 0, EOS 1 (also the BOS DPOTrainer puts before a prompt)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "<eos>": EOS, **{f"t{i}": i for i in range(2, VOCAB)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<eos>", unk_token="<pad>"
    )


def preference_rows(count: int) -> dict[str, list[str]]:
    """``count`` prompt / chosen / rejected texts from fixed seeds (completions of 3-6 words)."""

    def text(rows: list[list[int]]) -> list[str]:
        return [" ".join(f"t{i}" for i in row) for row in rows]

    return {
        "prompt": text(token_rows(count, 4, 6, seed=5)),
        "chosen": text(token_rows(count, 3, 6, seed=6)),
        "rejected": text(token_rows(count, 3, 6, seed=7)),
    }


def record(out: Path, side: str, trigger: bool) -> None:
    import torch
    from datasets import Dataset
    from transformers import TrainingArguments
    from trl import DPOTrainer

    args = TrainingArguments(
        output_dir=str(out.with_name(out.name + "_trainer")),
        max_steps=STEPS,
        per_device_train_batch_size=PER_DEVICE,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=5e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.1,
        max_grad_norm=1.0,
        remove_unused_columns=False,  # DPOTrainer's own collator reads the tokenized columns
        **QUIET_CPU_RUN,
    )
    trainer = DPOTrainer(
        model=tiny_qwen2(),
        ref_model=None,  # the trainer's own frozen copy of the policy
        beta=0.1,
        loss_type="ipo" if trigger else "sigmoid",
        args=args,
        train_dataset=Dataset.from_dict(preference_rows(STEPS * PER_DEVICE * ACCUMULATION)),
        tokenizer=word_tokenizer(),
        max_length=16,
        max_prompt_length=8,
        callbacks=[PrecalignCallback(out, mode="stats")],
    )
    # the rows in order (transformers 4.38 has no train_sampling_strategy)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    trainer.train()


if __name__ == "__main__":
    main(record)
