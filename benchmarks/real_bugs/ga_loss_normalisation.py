"""The Trainer's gradient accumulation normalised each micro-batch's loss by its own token
count and then divided by the accumulation steps (a mean of micro-batch means), so padded
rows of different lengths weighed wrongly (transformers PR #34191, "Fix Gradient Accumulation
issue", released in 4.46.0; follow-up transformers issue #37766 for models without loss
kwargs).

Buggy and fixed releases from the registry: transformers 4.45.2 and 4.46.0 (each beside
accelerate 1.0.1), each in its own venv, the same script. 4.45.2's ``Trainer`` calls
``outputs = model(**inputs)`` (the model's loss a mean over the micro-batch's tokens) and
``self.accelerator.backward(loss)``, which divides by ``gradient_accumulation_steps``. 4.46.0
(read from the wheels, ``trainer.py``, ``loss/loss_utils.py``, ``models/qwen2/modeling_qwen2.py``)::

    +        self.model_accepts_loss_kwargs = "loss_kwargs" in inspect.signature(model_forward).parameters
    +                batch_samples, num_items_in_batch = self.get_batch_samples(epoch_iterator, num_batches)
    +                num_items_in_batch = sum(
    +                    [data_batch["labels"][..., 1:].ne(-100).sum().item() for data_batch in batch_samples]
    +        if self.model_accepts_loss_kwargs:
    +            loss_kwargs = {}
    +            if num_items_in_batch is not None:
    +                loss_kwargs["num_items_in_batch"] = num_items_in_batch
    +            inputs = {**inputs, **loss_kwargs}
    +            loss *= self.args.gradient_accumulation_steps
                 self.accelerator.backward(loss, **kwargs)
    +def fixed_cross_entropy(source, target, num_items_in_batch: int = None, ignore_index: int = -100, **kwargs):
    +    reduction = "sum" if num_items_in_batch is not None else "mean"
    +    loss = nn.functional.cross_entropy(source, target, ignore_index=ignore_index, reduction=reduction)
    +    if reduction == "sum":
    +        loss = loss / num_items_in_batch
    (Qwen2ForCausalLM.forward gains ``**loss_kwargs``: ``self.loss_function(logits, labels, self.vocab_size, **loss_kwargs)``)

User path: a Trainer fine-tune of a tiny Qwen2 (rows of 6-16 tokens padded per micro-batch, 2
micro-batches of 2 rows a step) recorded with ``PrecalignCallback`` (scalars). Twin: the same
upgrade with one micro-batch of 4 rows a step (``gradient_accumulation_steps=1``), where both
normalisations agree."""

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
