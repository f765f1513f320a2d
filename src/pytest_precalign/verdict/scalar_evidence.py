"""Why a step's scalars differ (``training_scalars.ScalarDiff.evidence``), as facts: the step,
the scalar and the values each sentence states; the words are made when the verdict is
rendered (``reports.scalar_evidence_text``). No torch import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .side_values import NamedValues, StepValues, Values


@dataclass(frozen=True)
class BatchDiffers(StepValues[str]):
    """Each side's batch hash (DP replicas' joined: ``JOINED_HASH``)."""


@dataclass(frozen=True)
class RowsDiffer:
    step: int
    joined: tuple[str, ...]  # the sides whose DP replicas' rows were joined
    a: str  # each side's multiset hash of the step's rows
    b: str


@dataclass(frozen=True)
class TokensDiffer(StepValues[int]):
    """The tokens each side's step trained on."""


@dataclass(frozen=True)
class MicroBatchesCounted(StepValues[int]):
    """The micro-batches each side's step scalars count."""


@dataclass(frozen=True)
class LossDiffers(Values[float]):
    """Each side's loss."""


# What the grad norm's difference came with: a whole factor (``summed``), a loss that moved
# within its tolerance (``loss_moved``), a loss that matched (``loss_matched``).
GradNormHow = Literal["summed", "loss_moved", "loss_matched"]


@dataclass(frozen=True)
class GradNormDiffers(Values[float]):
    """Each side's grad norm (before clipping), and ``how`` it differs."""

    how: GradNormHow
    losses: tuple[float, float] = (0.0, 0.0)  # ``loss_moved``: each side's loss


@dataclass(frozen=True)
class GradNormPastForward(Values[float]):
    """The grad norm differs while every forward record of ``step`` matched (``compared``), the
    loss moved within its tolerance as it has since step ``since``: the backward."""

    step: int
    compared: int
    losses: tuple[float, float]
    since: int


@dataclass(frozen=True)
class ClipDiffers(Values[float]):
    """Each side's clip coefficient."""


@dataclass(frozen=True)
class ScheduleValuesDiffer(NamedValues[tuple[float, ...]]):
    """The values of ``name`` (lr or weight_decay, in groups laid out otherwise) in use on each
    side, sorted."""


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
