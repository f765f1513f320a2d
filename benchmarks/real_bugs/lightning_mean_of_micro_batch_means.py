"""Lightning's ``accumulate_grad_batches`` averages the micro-batches' mean losses, so with
padded rows of different lengths a token's weight depends on its micro-batch's token count:
gradient accumulation is not the large batch it stands for (Lightning issue #20350,
"Gradient accumulation calculation may be incorrect", open; the fix transformers made for
its Trainer is PR #34191).

Buggy side: Lightning as released (2.6), the LightningModule returning the model's own mean
loss. Fixed side, a re-implementation of the fix for a Lightning user: ``training_step``
returns the summed token loss over the step's token count times ``accumulate_grad_batches``
(Lightning divides by it again), i.e. the loss per token over the step. User path: a
LightningModule around a tiny Qwen2, ``L.Trainer(accumulate_grad_batches=2)`` recorded with
``PrecalignLightningCallback(module="model")`` (scalars). Twin: every row the same length,
where both normalisations agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _tiny import main, pad_batch, tiny_qwen2, token_rows

from pytest_precalign import PrecalignLightningCallback

ACCUMULATE, BATCHES = 2, 8


def record(out: Path, side: str, trigger: bool) -> None:
    import lightning as L

    rows = token_rows(BATCHES * 2) if trigger else token_rows(BATCHES * 2, 10, 10)
    loader = [pad_batch([{"input_ids": r} for r in rows[i : i + 2]]) for i in range(0, len(rows), 2)]
    targets = [int((b["labels"][:, 1:] != -100).sum()) for b in loader]
    per_step = [sum(targets[i : i + ACCUMULATE]) for i in range(0, BATCHES, ACCUMULATE)]

    class FineTune(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_qwen2()

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            if side == "buggy":
                return self.model(**batch).loss
            tokens = per_step[index // ACCUMULATE]
            return self.model(**batch, num_items_in_batch=tokens).loss * ACCUMULATE

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.model.parameters(), lr=5e-3, weight_decay=0.0)

    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=1,
        accumulate_grad_batches=ACCUMULATE,
        gradient_clip_val=1.0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out.with_name(out.name + "_pl")),
        callbacks=[PrecalignLightningCallback(out, mode="scalars", module="model")],
    )
    trainer.fit(FineTune(), train_dataloaders=torch.utils.data.DataLoader(loader, batch_size=None))


if __name__ == "__main__":
    main(record)
