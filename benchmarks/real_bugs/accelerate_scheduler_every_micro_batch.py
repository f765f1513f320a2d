"""Under gradient accumulation, Accelerate's ``AcceleratedScheduler`` stepped the LR scheduler
at every micro-batch, also when the optimizer had not stepped: the schedule ran
``gradient_accumulation_steps`` times too fast (accelerate issue #963, "Scheduler always steps
when training with gradient accumulation", fixed by accelerate PR #999: the scheduler steps
only when ``gradient_state.sync_gradients``).

Buggy side, a re-implementation quoting the fix's diff: the prepared scheduler's ``step``
steps the wrapped scheduler on every call. User path: a custom Accelerate loop
(``accelerator.accumulate``, ``accelerator.backward``, ``clip_grad_norm_``) recorded with
``AccelerateSteps`` (stats). Twin: ``gradient_accumulation_steps=1``, where every call is an
optimizer step."""

from __future__ import annotations

from pathlib import Path

import torch
from _tiny import main, pad_batch, tiny_qwen2, token_rows

from pytest_precalign import AccelerateSteps

STEPS = 4


def record(out: Path, side: str, trigger: bool) -> None:
    from accelerate import Accelerator
    from transformers import get_linear_schedule_with_warmup

    accumulation = 2 if trigger else 1
    rows = token_rows(STEPS * 4)
    per_micro = 4 // accumulation
    loader = [
        pad_batch([{"input_ids": r} for r in rows[i : i + per_micro]]) for i in range(0, len(rows), per_micro)
    ]
    accelerator = Accelerator(gradient_accumulation_steps=accumulation, cpu=True)
    model = tiny_qwen2()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 2, STEPS * 2)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if side == "buggy":
        inner = scheduler.scheduler
        scheduler.step = lambda *args, **kwargs: inner.step(*args, **kwargs)  # no sync_gradients check
    steps = AccelerateSteps(out, accelerator, model, optimizer, scheduler=scheduler, total_steps=STEPS)
    for batch in loader:
        with accelerator.accumulate(model):
            steps.micro_batch(batch)
            loss = model(**batch).loss
            steps.backward(loss)
            if accelerator.sync_gradients:
                steps.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    steps.close()


if __name__ == "__main__":
    main(record)
