"""What a case's training does, as frozen specs: the optimizer, its LR schedule, clipping,
weight decay and gradient accumulation, and which framework's machinery trains each side.
Torch-free; ``config`` parses YAML into these, each side's driver translates them into its
framework's own arguments (``transformers.TrainingArguments``, megatron-core's
``OptimizerConfig`` + ``OptimizerParamScheduler``, ``torch.optim`` + ``lr_scheduler``) and
writes that translation into the side's manifest.

Semantics shared by every framework (the translation must keep them):

- ``steps`` counts optimizer updates (0-based ``step`` in records). Step ``s`` uses batch ``s``
  of the case's inputs; with ``micro_batches: k`` that batch is split into ``k`` equal
  micro-batches along dim 0, the grads accumulated, and the loss normalised per token over the
  whole step (``sum of token losses / tokens in the step``), as transformers >= 4.46 does with
  ``num_items_in_batch`` and megatron-core with ``calculate_per_token_loss``.
- ``schedule``: the LR of update ``s`` (0-based) is ``lr * (s / warmup_steps)`` for
  ``s < warmup_steps`` (the first update uses LR 0 when ``warmup_steps > 0``, as both
  transformers and megatron-core do), then decays from ``lr`` to ``min_lr`` over the updates
  ``warmup_steps .. decay_steps`` (``decay_steps`` counts from update 0 and includes the
  warmup, as ``num_training_steps`` and ``lr_decay_steps`` do) by ``decay`` (``constant``:
  no decay; ``linear``; ``cosine``: half a cosine), and stays at ``min_lr`` after.
  ``decay_steps`` None means ``steps``.
- ``clip_grad``: the global L2 norm of all grads of the step (after accumulation, before the
  update) is clipped to this value; None: no clipping (the grad norm is still recorded).
- ``weight_decay`` applies to every parameter except those whose name matches a ``no_decay``
  glob; ``no_decay`` None means each framework's default, which is the same rule on both:
  biases and the weights of norm layers (1-d parameters) get none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, get_args

OptimizerName = Literal["adamw", "adam", "sgd"]
DecayStyle = Literal["constant", "linear", "cosine"]
OPTIMIZERS: Final[tuple[OptimizerName, ...]] = get_args(OptimizerName)
DECAY_STYLES: Final[tuple[DecayStyle, ...]] = get_args(DecayStyle)


@dataclass(frozen=True)
class ScheduleSpec:
    warmup_steps: int = 0
    decay: DecayStyle = "constant"
    decay_steps: int | None = None  # None: the case's steps
    min_lr: float = 0.0


@dataclass(frozen=True)
class OptimizerSpec:
    name: OptimizerName = "adamw"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    schedule: ScheduleSpec | None = None  # None: constant LR (no scheduler)
    clip_grad: float | None = None  # global L2 norm; None: no clipping
    no_decay: tuple[str, ...] | None = None  # globs; None: biases and norm weights (1-d params)
    micro_batches: int = 1  # gradient accumulation: micro-batches per optimizer step


@dataclass(frozen=True)
class SidesTraining:
    """Which machinery trains each side of a case: a name of ``steps.trainer_registry``
    (the config fills in a model's default, ``default_trainer``; None: the tool's loop)."""

    baseline: str | None = None
    candidate: str | None = None


@dataclass(frozen=True)
class SpecProblem:
    """What of a case's optimizer spec a side's framework cannot express (a trainer's
    ``problem``), and the key under ``optimizer:`` that says it ("": ``optimizer`` itself)."""

    message: str
    key: str = ""


def megatron_schedule_problem(schedule: ScheduleSpec | None, steps: int) -> str | None:
    """Why megatron-core's ``OptimizerParamScheduler`` cannot run ``schedule`` over ``steps``
    updates (None: it can): it decays after the warmup, so a decaying schedule needs its
    horizon (``decay_steps``, or the case's steps) longer than ``warmup_steps``."""
    if schedule is None or schedule.decay == "constant":
        return None
    horizon = schedule.decay_steps or steps
    if schedule.warmup_steps < horizon:
        return None
    named = "decay_steps" if schedule.decay_steps else "the case's steps (no decay_steps given)"
    return (
        f"megatron-core's OptimizerParamScheduler decays after the warmup: {named} ({horizon}) "
        f"must be > warmup_steps ({schedule.warmup_steps})"
    )


def megatron_problem(optimizer: OptimizerSpec, steps: int) -> SpecProblem | None:
    """What of ``optimizer`` megatron-core's stack cannot run (None: all of it), at the
    schedule key to change."""
    problem = megatron_schedule_problem(optimizer.schedule, steps)
    if problem is None or optimizer.schedule is None:
        return None
    return SpecProblem(
        problem, "schedule.decay_steps" if optimizer.schedule.decay_steps else "schedule.warmup_steps"
    )


def hf_trainer_problem(optimizer: OptimizerSpec, steps: int) -> SpecProblem | None:
    """What of ``optimizer`` ``TrainingArguments`` cannot express (None: all of it)."""
    if optimizer.no_decay is not None:
        return SpecProblem(
            "transformers.Trainer cannot express no_decay globs: it decides by Trainer.get_decay_parameter_names (biases and norms); leave no_decay out"
        )
    if optimizer.schedule is not None:
        problem = hf_schedule_problem(optimizer.schedule, steps)
        return (
            None
            if problem is None
            else SpecProblem(f"transformers.Trainer cannot express this schedule: {problem}")
        )
    return None


def hf_schedule_problem(schedule: ScheduleSpec, steps: int) -> str | None:
    """Why ``TrainingArguments`` cannot express ``schedule`` (None: it can). Its schedulers
    decay over ``max_steps`` (the case's steps) and only cosine has a floor (``min_lr``)."""
    if schedule.decay_steps is not None and schedule.decay_steps != steps and schedule.decay != "constant":
        return (
            f"decay_steps {schedule.decay_steps} differs from steps {steps} (its schedulers decay "
            "over max_steps)"
        )
    if schedule.min_lr > 0 and schedule.decay == "linear":
        return "decay 'linear' to a min_lr > 0 (its linear schedule decays to 0; cosine has min_lr)"
    return None
