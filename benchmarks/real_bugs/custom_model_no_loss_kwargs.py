"""After the gradient-accumulation fix (transformers PR #34191), the Trainer passes
``num_items_in_batch`` only to models whose ``forward`` takes ``**kwargs``; a user's own model
without them still gets a mean of micro-batch means, with no warning (transformers issue
#37766, "As gradient_accumulation_steps increases, the loss also increases": "If model does
not accept loss_kwargs, the loss is not divided by the number of items in the batch").

Buggy side: the user's own causal-LM wrapper with ``forward(input_ids, attention_mask,
labels)``. Fixed side, what the maintainers advise: the same wrapper taking ``**kwargs`` and
passing them to the model's loss, and declaring ``loss_type = "ForCausalLM"`` (without it the
Trainer of 5.24 counts the step's tokens before the shift, transformers PR #46204's bug, since
its fix keys on ``loss_type``: found by this benchmark's twin). User path: a Trainer fine-tune recorded with
``PrecalignCallback`` (scalars). Twin: ``gradient_accumulation_steps=1`` (one micro-batch a
step: both normalisations agree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _tiny import main, tiny_qwen2
from _trainer import finetune


class MyCausalLM(torch.nn.Module):
    """The user's own wrapper (a head of their own would sit here)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = tiny_qwen2()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)


class MyCausalLMWithLossKwargs(MyCausalLM):
    loss_type = "ForCausalLM"  # else transformers 5.24's Trainer counts position 0 (PR #46204 keys on it)

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, **kwargs: Any
    ) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)


def record(out: Path, side: str, trigger: bool) -> None:
    model = MyCausalLM() if side == "buggy" else MyCausalLMWithLossKwargs()
    if trigger:
        finetune(out, model)
    else:
        finetune(out, model, per_device=4, accumulation=1)


if __name__ == "__main__":
    main(record)
