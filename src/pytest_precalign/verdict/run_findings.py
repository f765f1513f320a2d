"""What a training run could not pair (``TrainingVerdict.findings``: each fails the case) and
what passed only because the table opted in (``TrainingVerdict.warnings``), as facts: the
sides, steps, names and values each one states; the words are made when the verdict is
rendered (``reports.training_evidence_text``). No torch import.

- ``StepsOneSided``: steps one side recorded and the other did not.
- ``ScalarOneSided``: a scalar one side recorded at common steps.
- ``UpdateSkippedOneSide``: the first step whose update one side skipped.
- ``BrokenAlike``: a judged scalar NaN (or the same Inf) on both sides; a warning when the
  table's rule accepts it (``accepted``), a finding otherwise.
- ``RecordedOneSide``: evidence checked before step 0 that one side only recorded.
- ``FrozenChanged``: a frozen parameter whose records change (``frozen_params``).
- ``NotTrainingRun``: a case expected to diverge in training that is not a training run.
- ``PlanMissing``: a side whose recorder could not write its plan (a warning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class StepsOneSided:
    side: str
    steps: tuple[int, ...]


@dataclass(frozen=True)
class ScalarOneSided:
    name: str
    side: str
    steps: tuple[int, ...]


@dataclass(frozen=True)
class UpdateSkippedOneSide:
    side: str  # the side that skipped it
    step: int


@dataclass(frozen=True)
class BrokenAlike:
    name: str  # the scalar
    value: float  # its first non-finite value on both sides
    since: int  # the first step it is
    steps: int  # how many common steps it is
    common: int  # of how many common steps
    accepted: bool = False  # the table's rule says ``equal_nan: true``: a warning


BeforeTraining = Literal["initial_params", "plan"]  # the run record's keys checked before step 0
BEFORE_TRAINING: tuple[BeforeTraining, ...] = ("initial_params", "plan")


@dataclass(frozen=True)
class RecordedOneSide:
    what: BeforeTraining
    side: str  # the side that recorded it


@dataclass(frozen=True)
class FrozenChanged:
    name: str
    side: str
    step: int  # after this step it is not what it was
    before: int | None = None  # after this step it was (None: its initial value, told below)
    initial_norm: float = 0.0  # the initial norm, and the norm after ``step`` (``before`` None)
    norm: float = 0.0


@dataclass(frozen=True)
class NotTrainingRun:
    """The case expects a run divergence (``expect: {step, diverged}``) and trains nothing."""


@dataclass(frozen=True)
class PlanMissing:
    side: str
    why: str  # the recorder's own reason (``TrainingSettings.plan_missing``)


RunFinding = (
    StepsOneSided
    | ScalarOneSided
    | UpdateSkippedOneSide
    | BrokenAlike
    | RecordedOneSide
    | FrozenChanged
    | NotTrainingRun
)
RunWarning = BrokenAlike | PlanMissing
