"""A user's own training loop recorded with ``pytest_precalign.Recorder`` (the shape of
``example_suites/recorded_runs/torch_loop.py``): AdamW with a no-decay group for 1-D
parameters, linear warmup, clipping at 1.0, ``micro`` micro-batches per step with the loss
per token over the step, the run's settings and each step's scalars recorded, layers in stats
mode. A case changes the pieces it is about through the keyword arguments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from _tiny import pad_batch, token_rows

from pytest_precalign import Recorder
from pytest_precalign.steps.step_evidence import StepEvidence, batch_hash, group_settings, token_count

Batch = dict[str, torch.Tensor]


def default_loss(model: torch.nn.Module, batch: Batch, tokens: int) -> torch.Tensor:
    return model(**batch, num_items_in_batch=tokens).loss


def logits_loss(model: torch.nn.Module, batch: Batch, tokens: int) -> torch.Tensor:
    """The same loss from the logits (summed over the shifted labels, over the step's tokens):
    for releases whose ``forward`` takes no ``num_items_in_batch`` (transformers < 4.46)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:].reshape(-1)
    flat = logits[:, :-1].float().reshape(-1, logits.shape[-1])
    return torch.nn.functional.cross_entropy(flat, labels, ignore_index=-100, reduction="sum") / tokens


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The grads' total 2-norm (``torch.nn.utils.get_total_norm``, torch >= 2.6; the same sum
    by hand under the older torch releases a torch bug's buggy side runs)."""
    if hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def clip_with_norm(params: list[torch.nn.Parameter], clip: float, norm: torch.Tensor) -> None:
    """``torch.nn.utils.clip_grads_with_norm_`` (torch >= 2.6), or its arithmetic by hand."""
    if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
        torch.nn.utils.clip_grads_with_norm_(params, clip, norm)
        return
    coef = torch.clamp(clip / (norm + 1e-6), max=1.0)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)


def train(
    out: Path,
    model: torch.nn.Module,
    *,
    steps: int = 4,
    rows: list[list[int]] | None = None,
    row_count: int = 4,
    micro: int = 2,
    lr: float = 5e-3,
    collate: Callable[[list[dict[str, list[int]]]], Batch] = pad_batch,
    loss: Callable[[torch.nn.Module, Batch, int], torch.Tensor] = default_loss,
    count: Callable[[Batch], int] | None = None,
    mode: str = "stats",
    clip: float = 1.0,
    precision: str | None = None,
) -> None:
    rows = token_rows(steps * row_count) if rows is None else rows
    model.train()
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 2))
    rec = Recorder(out, mode=mode)
    rec.record_settings(
        model,
        optimizer,
        scheduler,
        steps=steps,
        clip_grad=clip,
        micro_batches=micro,
        loss_normalisation="per_token_over_step",
        precision=precision,
    )
    rec.record_initial_params(model)
    evidence = StepEvidence(p for p in model.parameters() if p.requires_grad)
    size = row_count // micro
    for step in range(steps):
        group = rows[step * row_count : (step + 1) * row_count]
        batches = [
            collate([{"input_ids": r} for r in group[i * size : (i + 1) * size]]) for i in range(micro)
        ]
        tokens = sum(
            count(b) if count is not None else int((b["labels"][:, 1:] != -100).sum()) for b in batches
        )
        rec.start(model)
        evidence.begin()
        total = 0.0
        for b in batches:
            value = loss(model, b, tokens)
            rec.record_output("loss", value)
            value.backward()
            total += value.item()
        params = [p for p in model.parameters() if p.requires_grad]
        norm = total_norm([p.grad for p in params if p.grad is not None])
        evidence.grads_before_clip(norm=float(norm))
        clip_with_norm(params, clip, norm)
        evidence.grads_after_clip()
        lr_now, wd = group_settings(optimizer)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        rec.record_scalars(
            evidence.finish(
                step,
                loss=total,
                lr=lr_now,
                weight_decay=wd,
                tokens=token_count(batches),
                batch_hash=batch_hash(batches),
                micro_batches=micro,
                skipped=False,
            )
        )
        rec.stop()
        rec.step()
    rec.close()


def forward_only(out: Path, model: torch.nn.Module, batches: list[Batch], mode: str = "stats") -> None:
    """An inference check: each batch's forward recorded as one step (no update)."""
    model.eval()
    rec = Recorder(out, mode=mode)
    with torch.no_grad():
        for b in batches:
            rec.start(model)
            rec.record_output("logits", model(**{k: v for k, v in b.items() if k != "labels"}).logits)
            rec.stop()
            rec.step()
    rec.close()
