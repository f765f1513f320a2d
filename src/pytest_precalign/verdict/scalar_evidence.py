"""Why a step's scalars differ (``training_scalars.ScalarDiff.evidence``), as facts: the step,
the scalar and the values each sentence states; the words are made when the verdict is
rendered (``reports.scalar_evidence_text``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class BatchDiffers:
    step: int
    a: str  # each side's batch hash (DP replicas' joined: ``JOINED_HASH``)
    b: str


@dataclass(frozen=True)
class RowsDiffer:
    step: int
    joined: tuple[str, ...]  # the sides whose DP replicas' rows were joined
    a: str  # each side's multiset hash of the step's rows
    b: str


@dataclass(frozen=True)
class TokensDiffer:
    step: int
    a: int
    b: int


@dataclass(frozen=True)
class MicroBatchesCounted:
    step: int
    a: int  # the micro-batches each side's step scalars count
    b: int


@dataclass(frozen=True)
class LossDiffers:
    a: float
    b: float


# What the grad norm's difference came with: a whole factor (``summed``), a loss that moved
# within its tolerance (``loss_moved``), a loss that matched (``loss_matched``).
GradNormHow = Literal["summed", "loss_moved", "loss_matched"]


@dataclass(frozen=True)
class GradNormDiffers:
    a: float
    b: float
    how: GradNormHow
    losses: tuple[float, float] = (0.0, 0.0)  # ``loss_moved``: each side's loss


@dataclass(frozen=True)
class GradNormPastForward:
    """The grad norm differs while every forward record of ``step`` matched (``compared``), the
    loss moved within its tolerance as it has since step ``since``: the backward."""

    a: float
    b: float
    step: int
    compared: int
    losses: tuple[float, float]
    since: int


@dataclass(frozen=True)
class ClipDiffers:
    a: float
    b: float


@dataclass(frozen=True)
class ScheduleValuesDiffer:
    name: str  # lr or weight_decay, in groups laid out otherwise
    a: tuple[float, ...]  # the values in use on each side, sorted
    b: tuple[float, ...]


@dataclass(frozen=True)
class ScheduleDiffers:
    name: str
    step: int
    a: float
    b: float
    group: int


@dataclass(frozen=True)
class UpdateScalarDiffers:
    name: Literal["param_norm", "update_norm"]
    a: float
    b: float


@dataclass(frozen=True)
class EnvelopeQuote:
    """The noise envelope a scalar is outside of, at a step (``training_envelope``)."""

    name: str
    spread: float
    reruns: int
    allowed: float
    factor: float
    floor: float | None  # x |baseline|; None: the table's bound


@dataclass(frozen=True)
class OutsideEnvelope:
    evidence: ScalarEvidence
    quote: EnvelopeQuote


ScalarEvidence = (
    BatchDiffers
    | RowsDiffer
    | TokensDiffer
    | MicroBatchesCounted
    | LossDiffers
    | GradNormDiffers
    | GradNormPastForward
    | ClipDiffers
    | ScheduleValuesDiffer
    | ScheduleDiffers
    | UpdateScalarDiffers
    | OutsideEnvelope
)
