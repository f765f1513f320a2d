"""The tool's own training loop (``training: loop``): a case's ``OptimizerSpec`` as
``torch.optim`` + ``torch.optim.lr_scheduler.LambdaLR``, with parameter groups for weight
decay, and the loop's translated settings for the side's manifest (``TrainingSettings``).

The LR multiplier follows ``steps/spec.py``'s semantics, written in the arithmetic
transformers' schedulers use (so a loop and a ``transformers.Trainer`` run of one spec get
bitwise the same LRs). The plan's LRs are read from the scheduler itself, stepped on a
throwaway optimizer built as the loop builds its own over the side's parameters, not from
the formula.
"""

from __future__ import annotations

import fnmatch
import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ...steps.run_settings import optimizer_settings, params_precision, planned_lrs
from ...steps.spec import OptimizerSpec, ScheduleSpec
from ...trace.training_record import TrainingPlan, TrainingSettings

Group = tuple[list[str], list[torch.nn.Parameter], float]  # names, params, weight decay


def decays(name: str, param: torch.Tensor, no_decay: tuple[str, ...] | None) -> bool:
    """Whether weight decay applies to ``name``: not when it matches a ``no_decay`` glob; by
    default (None) not for 1-d parameters (biases, norm weights)."""
    if no_decay is None:
        return param.ndim > 1
    return not any(fnmatch.fnmatchcase(name, glob) for glob in no_decay)


def param_groups(named: Iterable[tuple[str, torch.nn.Parameter]], spec: OptimizerSpec) -> list[Group]:
    """[decayed, not decayed] (empty groups left out), trainable parameters only."""
    decayed: Group = ([], [], spec.weight_decay)
    kept: Group = ([], [], 0.0)
    for name, param in named:
        if not param.requires_grad:
            continue
        group = decayed if decays(name, param, spec.no_decay) else kept
        group[0].append(name)
        group[1].append(param)
    return [g for g in (decayed, kept) if g[1]]


def make_optimizer(spec: OptimizerSpec, groups: Any) -> torch.optim.Optimizer:
    """``groups``: parameters, or a list of ``{"params": ..., "weight_decay": ...}``."""
    if spec.name == "adamw":
        return torch.optim.AdamW(
            groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    if spec.name == "adam":
        return torch.optim.Adam(
            groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def grouped_optimizer(spec: OptimizerSpec, groups: Sequence[Group]) -> torch.optim.Optimizer:
    return make_optimizer(spec, [{"params": params, "weight_decay": wd} for _, params, wd in groups])


def lr_factor(schedule: ScheduleSpec, lr: float, steps: int, step: int) -> float:
    """The LR multiplier of update ``step`` (0-based), see ``steps/spec.py``."""
    warmup = schedule.warmup_steps
    if step < warmup:
        return float(step) / float(max(1, warmup))
    if schedule.decay == "constant":
        return 1.0
    horizon = schedule.decay_steps if schedule.decay_steps is not None else steps
    floor = schedule.min_lr / lr if lr > 0 else 0.0
    if step >= horizon:
        return floor
    if schedule.decay == "linear":
        factor = float(horizon - step) / float(max(1, horizon - warmup))
    else:
        progress = float(step - warmup) / float(max(1, horizon - warmup))
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return max(0.0, factor * (1 - floor) + floor)


def make_scheduler(
    spec: OptimizerSpec, optimizer: torch.optim.Optimizer, steps: int
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """``LambdaLR`` over the schedule (None: constant LR); ``scheduler.step()`` after each update."""
    schedule = spec.schedule
    if schedule is None:
        return None
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(schedule, spec.lr, steps, s))


def _loop_schedule(
    spec: OptimizerSpec, groups: Sequence[Group], steps: int
) -> tuple[tuple[tuple[float, ...], ...], list[float], dict[str, Any]]:
    """Per update, the LR of each group as the loop's own optimizer and scheduler give it
    (``steps.run_settings.planned_lrs``), each group's weight decay and the optimizer's
    settings (``optimizer_settings``) as that optimizer holds them: both built as the loop
    builds them (``grouped_optimizer``, ``make_scheduler``) over the side's own parameters, so
    what a user's patch of those classes does to this model shows, and only the scheduler is
    stepped (the throwaway optimizer never steps: no parameter changes)."""
    optimizer = grouped_optimizer(spec, groups)
    decay = [float(g.get("weight_decay", 0.0)) for g in optimizer.param_groups]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": on purpose
        scheduler = make_scheduler(spec, optimizer, steps)
    lrs = planned_lrs([optimizer], [] if scheduler is None else [scheduler], steps)
    assert lrs is not None  # the loop's schedulers are LambdaLR: stepped and put back
    return lrs, decay, optimizer_settings(optimizer)


def loop_plan(
    spec: OptimizerSpec, groups: Sequence[Group], steps: int, *, checkpointing: bool = False
) -> TrainingSettings:
    """The settings (``"training"`` block) of a side trained by the tool's own loop: written
    by the loop when it starts, and computed before any side trains for the contract check
    (``run.contract_check``); ``groups``: ``param_groups`` of the side's model;
    ``checkpointing``: its ``gradient_checkpointing``."""
    lrs, decay, settings = _loop_schedule(spec, groups, steps)
    schedule = spec.schedule
    scheduler = None
    if schedule is not None:
        scheduler = {
            "class": "torch.optim.lr_scheduler.LambdaLR",
            "warmup_steps": schedule.warmup_steps,
            "decay": schedule.decay,
            "decay_steps": schedule.decay_steps if schedule.decay_steps is not None else steps,
            "min_lr": schedule.min_lr,
            "stepped": "after each optimizer.step()",
        }
    optimizer_cls = {"adamw": "AdamW", "adam": "Adam", "sgd": "SGD"}[spec.name]
    own: dict[str, Any] = (
        {"momentum": spec.momentum} if spec.name == "sgd" else {"betas": list(spec.betas), "eps": spec.eps}
    )
    plan = TrainingPlan(
        lr=lrs,
        weight_decay=tuple(decay),
        groups=tuple(tuple(names) for names, _, _ in groups),
        clip_grad=spec.clip_grad,
        micro_batches=spec.micro_batches,
        loss_normalisation="per_token_over_step",
        precision=params_precision(p for _, params, _ in groups for p in params),
        autocast=False,
        gradient_checkpointing=checkpointing,
        **settings,
    )
    arguments = {
        "optimizer": f"torch.optim.{optimizer_cls}",
        "lr": spec.lr,
        **own,
        "param_groups": [{"weight_decay": wd, "params": len(names)} for names, _, wd in groups],
        "lr_scheduler": scheduler,
        "clip_grad_norm": spec.clip_grad,
        "gradient_accumulation": spec.micro_batches,
    }
    return TrainingSettings("loop", "torch", torch.__version__, arguments, plan)
