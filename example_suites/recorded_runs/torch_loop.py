"""A user's own training loop (no Trainer) recorded with ``pytest_precalign.Recorder``: AdamW
with a no-decay group, warmup + cosine, clipping, 2 micro-batches per step with the loss
normalised per token over the step, each step's scalars written with ``record_scalars``.

    python torch_loop.py OUT RUN [RUN ...]

Each RUN is ``NAME`` or ``NAME:key=value,...``, recorded under ``OUT/NAME``. Keys: ``mode``
(scalars | stats | tensor | hash; default scalars), ``steps`` (the steps whose layers are
recorded, ``3+4``), ``format`` (native | msprobe), ``lr`` (peak LR), faults from optimizer
step k: ``clip_from=k`` (clip norm 0.05), ``shuffle_from=k`` (rows of steps k.. permuted),
``layer_bug_from=k`` (model.layers.1.mlp's output x ``layer_scale``, default 1.2); and
``beta2`` (AdamW's, default 0.999: 0.99 is a silent optimizer change, with no plan recorded).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from tiny_setup import pad_batch, sweep, tiny_qwen2, token_rows

from pytest_precalign import Recorder
from pytest_precalign.steps.step_evidence import StepEvidence, batch_hash, group_settings, token_count

STEPS, ROWS, MICRO, WARMUP = 10, 4, 2, 2
BASELINE: dict[str, Any] = {
    "mode": "scalars",
    "steps": None,
    "format": "native",
    "lr": 5e-3,
    "clip_from": None,
    "shuffle_from": None,
    "layer_bug_from": None,
    "layer_scale": 1.2,
    "beta2": 0.999,
}


def cosine_with_warmup(step: int) -> float:
    if step < WARMUP:
        return step / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))


def train(out: Path, run: dict[str, Any]) -> None:
    model = tiny_qwen2()
    step_now = [0]
    if run["layer_bug_from"] is not None:
        k, scale = run["layer_bug_from"], run["layer_scale"]
        model.model.layers[1].mlp.register_forward_hook(
            lambda module, args, output: output * scale if step_now[0] >= k else None
        )
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=run["lr"],
        betas=(0.9, run["beta2"]),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup)
    shuffle = None if run["shuffle_from"] is None else run["shuffle_from"] * ROWS
    rows = token_rows(STEPS * ROWS, permute_after=shuffle)

    rec = Recorder(out, mode=run["mode"], steps=run["steps"], format=run["format"])
    evidence = StepEvidence(model.parameters())
    rec.record_initial_params(model)
    for step in range(STEPS):
        step_now[0] = step
        size = ROWS // MICRO
        micro = [
            pad_batch([{"input_ids": r} for r in rows[step * ROWS + i * size : step * ROWS + (i + 1) * size]])
            for i in range(MICRO)
        ]
        tokens = sum(int((m["labels"][:, 1:] != -100).sum()) for m in micro)
        rec.start(model)
        evidence.begin()
        loss = 0.0
        for m in micro:
            out_ = model(**m, num_items_in_batch=tokens)
            rec.record_output("loss", out_.loss)
            out_.loss.backward()
            loss += out_.loss.item()
        clip = 0.05 if run["clip_from"] is not None and step >= run["clip_from"] else 1.0
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        evidence.grads_before_clip(norm=float(norm))
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), clip, norm)
        evidence.grads_after_clip()
        lr, wd = group_settings(optimizer)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        rec.record_scalars(
            evidence.finish(
                step,
                loss=loss,
                lr=lr,
                weight_decay=wd,
                tokens=token_count(micro),
                batch_hash=batch_hash(micro),
                micro_batches=MICRO,
                skipped=False,
            )
        )
        rec.stop()
        rec.step()
    rec.close()


if __name__ == "__main__":
    sweep(sys.argv[1:], BASELINE, train, __doc__ or "")
