"""The case trainers: what trains one side of a case through its steps, one module each,
every one implementing ``CaseTrainer`` (``LaunchedTrainer`` too when its registry entry is
``launchable``) as its module-level ``TRAINER``; which exist, and what each can do, is
``steps.trainer_registry``.

``loop`` (the tool's own loop; ``loop_optimizer``: its ``torch.optim`` optimizer, scheduler
and plan; ``loop_step``: one step's update and evidence; ``loop_ranks``: its launched
ranks), ``hf_trainer`` (a real ``transformers.Trainer``), ``megatron`` (megatron-core's own
stack, in process and on launched ranks), ``lightning`` (PyTorch Lightning's own loop: a
``LightningModule`` around the model, recorded by ``PrecalignLightningCallback``'s machinery),
``skeleton`` (``StepSkeleton``: what every trainer
does at each step: the recorder's step, the seed, the step replay's boundary, the parameter
records after the update), ``case_step`` (what every trainer does with one micro-batch: the
split, the case's forward and loss, recorded).

Adding a trainer: one module here exposing ``TRAINER`` and one line in
``steps.trainer_registry.BUILT_IN`` naming it; a team's own trainer is a module of its own,
registered from outside the package (``trainer_registry.register_trainer``: a conftest's
``pytest_precalign_trainers`` hook or an entry point).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from ...errors import CaseError
from ...steps.trainer_registry import PLAIN, trainer_info
from ...trace.training_record import RunRecord

if TYPE_CHECKING:
    import torch

    from ...config.specs import CaseSpec, ModelSpec
    from ...sources import LoadedModel
    from ...sources.inputs import CaseInputs
    from ...trace.training_record import TrainingSettings
    from .skeleton import StepSkeleton


class CaseTrainer(Protocol):
    def plan(
        self, model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, seed: int
    ) -> TrainingSettings | None:
        """The settings (arguments + plan) this side's trainer will write, made before it
        trains, for the contract check (None: no plan, nothing checked before training)."""
        ...

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        """Train the side through ``case.steps`` with ``steps.recorder`` on (entered by the
        caller), each step through ``steps``; the side's run record (settings and plan, each
        step's scalars, the initial parameters; empty when it took no optimizer step)."""
        ...


class LaunchedTrainer(CaseTrainer, Protocol):
    def train_rank(
        self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton, out: Path, rank: int
    ) -> None:
        """One launched rank's part of the side (``run.rank_main``): its steps through
        ``steps`` (no recorder: the rank records with the public ``Recorder`` into
        ``out/step<N>/rank<R>``) and whatever evidence ``launched_evidence`` reads back."""
        ...

    def launched_evidence(
        self, out: Path, nproc: int, full_weights: Mapping[str, torch.Tensor] | None
    ) -> RunRecord:
        """In the parent, once the ranks finished: the side's run record from what they wrote
        under ``out`` (``full_weights``: the TP=1 weights they loaded; empty: none)."""
        ...


def case_trainer(name: str) -> CaseTrainer:
    """The ``TRAINER`` of the registry entry ``name``'s driver module (imported now; a
    framework that is not installed is one ``CaseError`` naming it)."""
    info = trainer_info(name)
    try:
        driver = importlib.import_module(info.driver)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or str(exc)
        raise CaseError(
            f"training: {name} trains with {info.framework}, which cannot be imported here "
            f"({missing!r}: {exc}); install it in this environment or choose another trainer"
        ) from None
    return cast("CaseTrainer", driver.TRAINER)


def launched_trainer(name: str) -> LaunchedTrainer:
    """``case_trainer(name)`` of a ``launchable`` registry entry."""
    if not trainer_info(name).launchable:
        raise ValueError(f"trainer {name!r} cannot train a launched side (its registry entry)")
    return cast("LaunchedTrainer", case_trainer(name))


def side_trainer(case: CaseSpec, side: object) -> str:
    """The trainer of ``side`` (``"baseline"``/``"candidate"``): its ``training:`` (the config
    fills in its model's default, ``trainer_registry.default_trainer``), else the tool's loop
    (``PLAIN``), which also records a case that takes no optimizer step."""
    if "step" not in case.phases:
        return PLAIN
    chosen = getattr(case.training.trainers, side, None) if side in ("baseline", "candidate") else None
    return chosen if isinstance(chosen, str) else PLAIN


def checked_run_record(name: str, case: CaseSpec, record: RunRecord, steps: int) -> RunRecord:
    """``record``, what trainer ``name`` returned, when it is the run record of the ``steps``
    it trained: settings with a plan and every step's scalars; else a ``CaseError`` naming
    what is missing (fail closed: a run is never judged on less)."""
    missing = [] if record.plan is not None else ["its settings and plan"]
    absent = [step for step in range(steps) if step not in record.scalars]
    if absent:
        missing.append(f"the scalars of step(s) {absent}")
    if missing:
        raise CaseError(
            f"case {case.name!r}: training: {name} trained {steps} step(s) but its run record lacks "
            f"{' and '.join(missing)} (a trainer returns RunRecord(settings, scalars, initial))"
        )
    return record
