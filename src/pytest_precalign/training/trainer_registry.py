"""The case trainers, one line each: which machinery can train a side (``training:`` in a
case), the model sources it trains, which it trains by default, whether it can train a side
launched under torchrun, whether isolation mode works with it, where its recorder takes the
parameter grads, the ``run/trainers`` module that drives it and what of a case's optimizer
spec its framework cannot express. Torch-free: ``config`` validates ``training:`` from it,
``run.trainers.case_trainer`` imports the driver it names.

Adding a trainer: one module in ``run/trainers/`` exposing ``TRAINER`` (the
``run.trainers.CaseTrainer`` protocol) and one ``TrainerInfo`` line in ``TRAINERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from .spec import OptimizerSpec, SpecProblem, hf_trainer_problem, megatron_problem

ParamGrads = Literal["step", "backward"]
# The trainer of a side no entry claims by default (``default_for``), and of a case that takes
# no optimizer step (its forward and backward recorded by the tool's own loop).
PLAIN: Final = "loop"


@dataclass(frozen=True)
class TrainerInfo:
    name: str  # the value of ``training:``
    framework: str  # what trains the side, as messages name it
    sources: tuple[str, ...]  # model sources (``models.<name>.source``) it can train
    driver: str  # the dotted ``run/trainers`` module whose ``TRAINER`` implements it
    default_for: tuple[str, ...] = ()  # sources whose sides it trains when ``training:`` is left out
    launchable: bool = False  # trains a side launched under torchrun (``TRAINER.train_rank``)
    data_parallel: bool = False  # launched data-parallel replicas split each step's batch
    isolation: bool = False  # isolation mode (calls after step 0's forward) works with it
    param_grads: ParamGrads = "backward"  # when the recorder takes the parameter grads
    # What of a case's optimizer spec (over its steps) the framework cannot express (None: all).
    problem: Callable[[OptimizerSpec, int], SpecProblem | None] | None = None


_RUN = "pytest_precalign.run.trainers."
# fmt: off
TRAINERS: Final[tuple[TrainerInfo, ...]] = (
    TrainerInfo(PLAIN, "the tool's torch.optim loop", ("hf", "factory", "megatron"), _RUN + "loop", launchable=True, isolation=True),
    TrainerInfo("hf_trainer", "transformers.Trainer", ("hf",), _RUN + "hf_trainer", problem=hf_trainer_problem),
    TrainerInfo("megatron", "megatron-core", ("megatron",), _RUN + "megatron", default_for=("megatron",), launchable=True, data_parallel=True, param_grads="step", problem=megatron_problem),
    TrainerInfo("lightning", "PyTorch Lightning", ("hf", "factory"), _RUN + "lightning"),
)
# fmt: on


def trainer_names() -> tuple[str, ...]:
    return tuple(info.name for info in TRAINERS)


def trainer_info(name: str) -> TrainerInfo:
    """The registry's entry of ``name`` (a ``KeyError`` naming the registered ones: the
    config validated every ``training:`` value against them)."""
    for info in TRAINERS:
        if info.name == name:
            return info
    raise KeyError(f"unknown trainer {name!r} (allowed: {', '.join(trainer_names())})")


def default_trainer(source: str | None) -> str | None:
    """The trainer whose entry claims the sides of ``source`` left without ``training:``
    (None: no entry claims it, such a side trains with ``PLAIN``, the tool's loop)."""
    return next((info.name for info in TRAINERS if source in info.default_for), None)
