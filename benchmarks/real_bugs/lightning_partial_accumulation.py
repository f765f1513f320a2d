"""With ``accumulate_grad_batches=N``, Lightning divides every micro-batch's loss by N, also
in the last, shorter accumulation of an epoch: that step's gradient is scaled by the number of
micro-batches it has over N instead of averaged over them (Lightning issue #19987, "Handle
gradient accumulations at the end of epoch differently", open; the same class as transformers
PR #34191).

Here the buggy side is Lightning as released (2.6) and the fixed side a re-implementation:
the user's ``training_step`` rescales the loss of the last, short accumulation by
``N / micro-batches in it`` (what averaging over the micro-batches the step really has
gives). User path: a LightningModule around a tiny Qwen2, ``L.Trainer(accumulate_grad_batches=4)``
recorded with ``PrecalignLightningCallback(module="model")`` (scalars). 10 micro-batches: steps
0 and 1 have 4, step 2 has 2. Twin: 8 micro-batches (no short accumulation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from _tiny import main, pad_batch, tiny_qwen2, token_rows

from pytest_precalign import PrecalignLightningCallback

ACCUMULATE = 4


def record(out: Path, side: str, trigger: bool) -> None:
    import lightning as L

    batches = 10 if trigger else 8
    rows = token_rows(batches * 2)
    loader = [pad_batch([{"input_ids": r} for r in rows[i : i + 2]]) for i in range(0, len(rows), 2)]

    class FineTune(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_qwen2()

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            short = batches % ACCUMULATE
            if side == "fixed" and short and index >= batches - short:
                loss = loss * ACCUMULATE / short  # average over the micro-batches the step really has
            return loss

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
