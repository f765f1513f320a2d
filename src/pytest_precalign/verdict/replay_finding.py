"""What the run verdict holds of the replay of its first divergent step (``run.step_replay``),
as typed facts: what the replay found (``ReplayFinding``), or why the step was not replayed
(``NotReplayed``). Told in words when rendered (``reports.replay_text``). No torch import."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..vocabulary import TrainingClass
from .run_evidence import RunEvidence


@dataclass(frozen=True)
class StepMatched:
    """The replayed step matched on equal state (``compared`` records): what differs is the state
    the candidate carried into it."""

    step: int
    compared: int


@dataclass(frozen=True)
class ReplayFinding:
    """What replaying step ``step`` from the baseline's state found (``origin`` "" : nothing)."""

    step: int
    origin: str
    what: TrainingClass | Literal["none"]  # "none": the replay found no divergence
    evidence: RunEvidence | StepMatched  # told when rendered (``reports.replay_text``)
    starts: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # side -> param -> sha1

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "from_step": self.step - 1 if self.step > 0 else None,
            "origin": self.origin or None,
            "phase": self.what,
        }  # + its evidence and story, in words (``reports.training_json``)


@dataclass(frozen=True)
class NotReplayed:
    """Why the first divergent step was not replayed (``reason``, in words: the sides are stored
    runs, launched, built by the test; the replay itself failed)."""

    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {}  # the reason is told with what to record instead (``reports.replay_text``)


# What the run verdict is told of the replay: what it found, why it did not replay, or nothing
# (None: the case does not replay, or was not asked).
Replay = ReplayFinding | NotReplayed | None
