"""The case trainers, one line each: which machinery can train a side (``training:`` in a
case), the model sources it trains, which it trains by default, whether it can train a side
launched under torchrun, whether isolation mode works with it, where its recorder takes the
parameter grads, the ``run/trainers`` module that drives it and what of a case's optimizer
spec its framework cannot express. Torch-free: ``config`` validates ``training:`` from it,
``run.trainers.case_trainer`` imports the driver it names.

The package's own trainers are ``BUILT_IN``. Adding a trainer: a module exposing
``TRAINER`` (the ``run.trainers.CaseTrainer`` protocol) and a ``TrainerInfo`` naming it, given
to ``register_trainer``: from a conftest's ``pytest_precalign_trainers`` hook (the plugin
registers what it returns before the config is read), or from an installed distribution's
entry point in the group ``pytest_precalign.trainers`` (a ``TrainerInfo``, read once, on the
registry's first use: a launched rank sees it too). A name registered twice is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Final, Literal

from ..errors import ConfigError
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
BUILT_IN: Final[tuple[TrainerInfo, ...]] = (
    TrainerInfo(PLAIN, "the tool's torch.optim loop", ("hf", "factory", "megatron"), _RUN + "loop", launchable=True, isolation=True),
    TrainerInfo("hf_trainer", "transformers.Trainer", ("hf",), _RUN + "hf_trainer", problem=hf_trainer_problem),
    TrainerInfo("megatron", "megatron-core", ("megatron",), _RUN + "megatron", default_for=("megatron",), launchable=True, data_parallel=True, param_grads="step", problem=megatron_problem),
    TrainerInfo("lightning", "PyTorch Lightning", ("hf", "factory"), _RUN + "lightning"),
)
# fmt: on


# Every registered trainer by name, in registration order: the built-in ones, then the entry
# points' (on first use), then those registered by ``register_trainer``.
TRAINERS: dict[str, TrainerInfo] = {info.name: info for info in BUILT_IN}
ENTRY_POINTS: Final = "pytest_precalign.trainers"


def register_trainer(info: TrainerInfo) -> None:
    """Add ``info`` to the registry, so that ``training: <info.name>`` is accepted and its
    driver's ``TRAINER`` trains the side. A ``ConfigError`` when the name is taken (by the
    package or another registration) or the entry is malformed."""
    _read_entry_points()
    _add(info)


def _add(info: TrainerInfo) -> None:
    if not isinstance(info, TrainerInfo):
        raise ConfigError(f"register_trainer: expected a TrainerInfo, got {type(info).__name__}")
    if not info.name.isidentifier() or not info.driver or not info.sources:
        raise ConfigError(
            f"register_trainer: trainer {info.name!r} needs a name that is an identifier, a driver "
            f"module and the model sources it trains (got driver {info.driver!r}, sources {info.sources!r})"
        )
    taken = TRAINERS.get(info.name)
    if taken is not None:
        raise ConfigError(
            f"register_trainer: a trainer named {info.name!r} is already registered "
            f"({taken.framework}, driver {taken.driver}); choose another name"
        )
    TRAINERS[info.name] = info


def unregister_trainer(name: str) -> None:
    """Remove what ``register_trainer`` added under ``name`` (a built-in trainer stays)."""
    if name not in {info.name for info in BUILT_IN}:
        TRAINERS.pop(name, None)


def _registry() -> dict[str, TrainerInfo]:
    """``TRAINERS``, the entry points' trainers read into it once."""
    _read_entry_points()
    return TRAINERS


@cache
def _read_entry_points() -> None:
    for point in metadata.entry_points(group=ENTRY_POINTS):
        info = point.load()
        if not isinstance(info, TrainerInfo):
            raise ConfigError(
                f"entry point {point.name!r} ({point.value}) in group {ENTRY_POINTS}: "
                f"expected a TrainerInfo, got {type(info).__name__}"
            )
        _add(info)


def trainer_names() -> tuple[str, ...]:
    return tuple(_registry())


def trainer_info(name: str) -> TrainerInfo:
    """The registry's entry of ``name`` (a ``KeyError`` naming the registered ones: the
    config validated every ``training:`` value against them)."""
    info = _registry().get(name)
    if info is None:
        raise KeyError(f"unknown trainer {name!r} (allowed: {', '.join(trainer_names())})")
    return info


def default_trainer(source: str | None) -> str | None:
    """The trainer whose entry claims the sides of ``source`` left without ``training:``
    (None: no entry claims it, such a side trains with ``PLAIN``, the tool's loop)."""
    return next((info.name for info in _registry().values() if source in info.default_for), None)
