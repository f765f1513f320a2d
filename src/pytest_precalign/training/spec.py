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
# How a side trains: the tool's own loop (torch.optim + torch.optim.lr_scheduler), a
# transformers.Trainer, or megatron-core's own stack (DDP, get_megatron_optimizer,
# OptimizerParamScheduler, finalize_model_grads). None in a case: the model's default
# (megatron for a megatron-core model, loop otherwise).
Trainer = Literal["loop", "hf_trainer", "megatron"]

OPTIMIZERS: Final[tuple[OptimizerName, ...]] = get_args(OptimizerName)
DECAY_STYLES: Final[tuple[DecayStyle, ...]] = get_args(DecayStyle)
TRAINERS: Final[tuple[Trainer, ...]] = get_args(Trainer)


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
    """Which machinery trains each side of a case (None: the tool's loop; the config fills in
    a model's default: ``megatron`` for a ``source: megatron`` model)."""

    baseline: Trainer | None = None
    candidate: Trainer | None = None


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
