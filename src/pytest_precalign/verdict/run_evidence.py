"""Why a training run verdict names its first divergent step, class and origin
(``FirstDivergent.evidence``), as facts: the steps, names and values each sentence states; the
words are made when the verdict is rendered (``reports.training_evidence_text``). Evidence
another module judges comes typed from it: a scalar's (``training_scalars.ScalarDiff``), the
plans' (``training_contract.ContractDiff``), a layer's origin (``origin_facts.CaseOrigin``), the
grad at the model's output (``model_output.OutputGrad``), a replica's mismatch
(``ReplicaMismatch``). No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.note_blocks import ReplicaMismatch
from ..vocabulary import TrainingClass
from .model_output import OutputGrad
from .origin_facts import CaseOrigin
from .side_values import NamedValues
from .training_contract import ContractDiff
from .training_scalars import ScalarDiff


@dataclass(frozen=True)
class ScalarsDiffer:
    """A step's scalar that differs (``training_scalars``); ``layers_hint``: the loss differs and
    the step has no layer records to tell the forward from the loss."""

    scalar: ScalarDiff
    layers_hint: bool = False


@dataclass(frozen=True)
class MovedBefore(NamedValues[float]):
    """A scalar moved (within its tolerance) at ``step`` after bitwise-equal steps; step
    ``then_step`` diverged past a tolerance in ``then_what`` (``then_origin``); ``name``: loss,
    grad_norm or update_norm."""

    step: int
    then_step: int
    then_what: TrainingClass
    then_origin: str


@dataclass(frozen=True)
class PlansDiffer:
    diff: ContractDiff  # the sides' settings before training


@dataclass(frozen=True)
class InitialParamsDiffer(NamedValues[float]):
    """The norm of parameter ``name`` on each side."""

    more: int  # how many other parameters differ


@dataclass(frozen=True)
class MicroBatchesDiffer:
    step: int
    base: int  # how many times every module ran in the step, each side
    cand: int


@dataclass(frozen=True)
class LayerDiffers:
    record: str  # the first failing record of the step
    kind: str
    origin: CaseOrigin  # where the phase's walk puts its origin, and on what evidence


@dataclass(frozen=True)
class LossRecordDiffers:
    metric: str | None  # the failing check (None: none shown)
    value: float = 0.0
    allowed: float = 0.0


@dataclass(frozen=True)
class LossGradDiffers:
    losses_matched: int
    record: str  # the first backward record: the grad w.r.t. its output
    metric: str
    value: float
    allowed: float


@dataclass(frozen=True)
class OutputGradDiffers:
    found: OutputGrad
    losses: tuple[float, float]  # the logged loss of each side


@dataclass(frozen=True)
class GradsScaled:
    step: int
    count: int  # parameter grads compared
    factor: float


@dataclass(frozen=True)
class GradsOneSided:
    step: int
    grads: tuple[tuple[str, str], ...]  # (parameter, the side that has its grad)


@dataclass(frozen=True)
class GradsChanged:
    step: int
    failed: int
    compared: int


@dataclass(frozen=True)
class GradNormOverOtherGrads:
    scalar: ScalarDiff  # the grad norm's difference
    compared: int  # parameter grads recorded, all matched


@dataclass(frozen=True)
class UpdateDiffers:
    name: str  # the parameter whose grad matched and whose update did not


@dataclass(frozen=True)
class ReplicasDisagree:
    mismatch: ReplicaMismatch
    scalar: str | None = None  # the step scalar's name (None: a record)


@dataclass(frozen=True)
class TpShares:
    """Each TP rank's partial sum of ``origin`` before the all-reduce (``grads``: its local
    shard of the parameter ``origin``'s grad) against the other side's same rank's
    (``tp_ranks``): ``differ`` the ranks whose differ (empty: every one matches); None: which
    rank cannot be told against a run without the same TP layout."""

    origin: str
    grads: bool
    differ: tuple[str, ...] | None
    rtol: float = 0.0  # the relative tolerance of their statistics


@dataclass(frozen=True)
class RankRows:
    """One DP replica's rows of a joined record against the other side's same rows."""

    rank: str
    first: int  # its first row of the global batch
    rows: int
    check: tuple[str, float, float] | None  # the failing (metric, value, allowed); None: within tolerance
    passed: bool = True


@dataclass(frozen=True)
class ReplicaRows:
    """The ``side``'s DP replicas' rows of the first divergent record, rank by rank
    (``dp_rows``); ``ranks`` empty: statistics cannot tell the rank against a run split otherwise."""

    side: str
    ranks: tuple[RankRows, ...] = ()


RankNote = TpShares | ReplicaRows


@dataclass(frozen=True)
class RanksTold:
    """``evidence``, and what the ranks of a parallel side say of it (``tp_ranks``, ``dp_rows``)."""

    evidence: RunEvidence
    notes: tuple[RankNote, ...]


RunEvidence = (
    ScalarsDiffer
    | MovedBefore
    | PlansDiffer
    | InitialParamsDiffer
    | MicroBatchesDiffer
    | LayerDiffers
    | LossRecordDiffers
    | LossGradDiffers
    | OutputGradDiffers
    | GradsScaled
    | GradsOneSided
    | GradsChanged
    | GradNormOverOtherGrads
    | UpdateDiffers
    | ReplicasDisagree
    | RanksTold
)


def told_with(evidence: RunEvidence, *notes: RankNote) -> RanksTold:
    """``evidence`` with the ranks' ``notes`` after any it already has."""
    if isinstance(evidence, RanksTold):
        return RanksTold(evidence.evidence, (*evidence.notes, *notes))
    return RanksTold(evidence, notes)
