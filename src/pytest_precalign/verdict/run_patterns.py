"""What a training run's first divergence looks like over the whole model
(``FirstDivergent.pattern``), as facts: the factors, sides, steps and counts each sentence
states; the words are made when the verdict is rendered (``reports.run_pattern_text``).
``None``: no whole-model pattern. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByOneFactor:
    """A pattern the sides differ in by one ``factor`` (x``factor``)."""

    factor: float


@dataclass(frozen=True)
class LossFunctionDiffers:
    """The grad w.r.t. the model's output differs while the loss matched: another loss function."""


@dataclass(frozen=True)
class LossGradScaled(ByOneFactor):
    """Every grad scaled by ``factor`` from the model's output on: the loss's gradient is scaled."""


@dataclass(frozen=True)
class GradsScaledBy(ByOneFactor):
    """Every parameter grad scaled by ``factor``: a loss scale, or grads summed."""


@dataclass(frozen=True)
class GradsOnOneSide:
    """Parameters that get a grad on one side only (``grads_one_sided``)."""


@dataclass(frozen=True)
class ClippedPerMicroBatch:
    """Only ``late`` clipped at the update; ``early`` clipped each micro-batch's grads."""

    late: str
    early: str


@dataclass(frozen=True)
class GradsChangedAfterBackward:
    """The grads changed between the backward and the update."""


@dataclass(frozen=True)
class GradNormOverOthers:
    """The grad norm is computed over other grads or parameters than the other side's."""


@dataclass(frozen=True)
class EveryParamUpdated:
    """Every parameter (``count``) differs after the update while its grad matched."""

    count: int


@dataclass(frozen=True)
class MicroBatchSplit:
    """The sides split a step into ``base`` and ``cand`` micro-batches; ``planned``: the plans
    say so (each step), else the step's records count them (that step)."""

    base: object
    cand: object
    planned: bool = False


@dataclass(frozen=True)
class GradNormSummed(ByOneFactor):
    """The grad norm is x``factor`` (a whole number): grads summed instead of averaged."""


@dataclass(frozen=True)
class OnlyOneClipped:
    side: str  # the side that clipped
    factor: float  # its clip coefficient


@dataclass(frozen=True)
class ClippedDifferently:
    """Both sides clipped, by different factors."""


@dataclass(frozen=True)
class LrScaledAtStep(ByOneFactor):
    """Every parameter group's LR of the step differs by one ``factor``."""


@dataclass(frozen=True)
class DecayOneSided:
    """Weight decay on parameters one side only decays; ``candidate``: the candidate decays them."""

    candidate: bool


@dataclass(frozen=True)
class ScheduleShifted:
    """The candidate's LR schedule is ``lag`` step(s) behind (``behind``) or ahead of the baseline's."""

    lag: int
    behind: bool


@dataclass(frozen=True)
class ScheduleScaled(ByOneFactor):
    """Every step's LR scaled by ``factor``."""


@dataclass(frozen=True)
class DecayHorizon:
    """Same peak LR; the decay ends at another step (None: after the last planned step)."""

    base_end: int | None
    cand_end: int | None


@dataclass(frozen=True)
class OtherRows:
    """The sides trained other rows at the step: another sampler order, or other data."""


@dataclass(frozen=True)
class AdapterOneSided:
    """One side trains a PEFT adapter the other has not."""


RunPattern = (
    LossFunctionDiffers
    | LossGradScaled
    | GradsScaledBy
    | GradsOnOneSide
    | ClippedPerMicroBatch
    | GradsChangedAfterBackward
    | GradNormOverOthers
    | EveryParamUpdated
    | MicroBatchSplit
    | GradNormSummed
    | OnlyOneClipped
    | ClippedDifferently
    | LrScaledAtStep
    | DecayOneSided
    | ScheduleShifted
    | ScheduleScaled
    | DecayHorizon
    | OtherRows
    | AdapterOneSided
)
