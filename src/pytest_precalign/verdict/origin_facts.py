"""What a phase's origin claim rests on (``Divergence.proof``, ``CaseOrigin.evidence``), as
facts: the records, modules, slots and sizes each claim states; the words are made when the
verdict is rendered (``reports.origin_text``). Record ids are held as recorded
(``name|kind|slot|step|call``). No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from ..trace.json_fields import field_dict
from ..vocabulary import Kind, Phase


@dataclass(frozen=True)
class Matched:
    """The origin's ``inputs`` were compared and matched, its output did not; or (a parameter
    after the step) its ``grad`` matched and the optimizer step made it differ."""

    what: Literal["inputs", "grad"]


@dataclass(frozen=True)
class UpdateCheck:
    """The optimizer step is wrong on its own inputs: its update check's note (the compare
    layer's, ``PairResult.note``)."""

    note: str


@dataclass(frozen=True)
class BetweenChildren:
    """``module``'s inputs and ``children`` matched, what ``child`` received did not: the
    divergence enters in ``module``'s own code."""

    module: str
    child: str  # the failing record's name under ``module``
    what: Literal["input", "output_grad"]  # the child's input (forward), its output's grad (backward)
    children: tuple[str, ...]  # the module's children that matched before it


@dataclass(frozen=True)
class NoMatchedModule:
    """No enclosing module with matching inputs was recorded; ``walked``: the walk up from the
    record found modules, but none whose inputs were compared and matched (unproven)."""

    walked: bool


@dataclass(frozen=True)
class NoPartner:
    """Unproven: the record's inputs without a partner (record ids; the first is named)."""

    inputs: tuple[str, ...]


@dataclass(frozen=True)
class InputsWithinTolerance:
    """The inputs passed but differed, up to ``size`` (relative) at ``input_id``; the output's
    own relative change (None: no measure)."""

    input_id: str
    size: float
    own: float | None


@dataclass(frozen=True)
class SteeringInputs:
    """The module's data inputs matched; these inputs that are not data (a mask, positions) kept
    their form and differ in value: the divergence enters through them."""

    slots: tuple[str, ...]


@dataclass(frozen=True)
class MovedOutput:
    """The first output of the step to differ at all (by ``size`` relative, within tolerance;
    None: no measure) on identical inputs; ``failing`` (a record id) failed downstream of it."""

    size: float | None
    failing: str


@dataclass(frozen=True)
class MovedInput:
    """The first record of the step to differ at all is ``start`` (a module input, record id),
    after identical records; ``module``'s inputs were identical, so its own code made it."""

    start: str
    size: float | None
    module: str
    failing: str


@dataclass(frozen=True)
class OneSided:
    """A call only one side made: ``name`` ``call`` in ``direction``, made by ``side`` only."""

    name: str
    call: int
    direction: Literal["forward", "backward"]
    side: Literal["baseline", "candidate"]


@dataclass(frozen=True)
class OneSideBefore:
    """Unproven, and a call only one side made just before the record is the likely entry;
    ``prior``: what the claim rested on before (None: no enclosing module whose inputs matched
    was recorded)."""

    prior: WalkProof | None
    sides: tuple[OneSided, ...]


E = TypeVar("E")


@dataclass(frozen=True)
class OtherData(Generic[E]):
    """Unproven: the batch of ``step`` differs (``data``, the run verdict's evidence,
    ``run_evidence.RunEvidence``: generic here, as that union holds a layer's ``CaseOrigin``);
    ``downstream``: the record is at a later step."""

    step: int
    downstream: bool
    data: E


# What the walk from a failing record finds (``phase._origin``).
WalkProof = (
    UpdateCheck
    | NoPartner
    | InputsWithinTolerance
    | SteeringInputs
    | MovedOutput
    | MovedInput
    | NoMatchedModule
)
# Every claim but the data story's (``OtherData``): told without the run verdict.
ModuleProof = WalkProof | Matched | BetweenChildren | OneSideBefore
OriginProof = ModuleProof | OtherData[Any]


@dataclass(frozen=True)
class LowerPrecisionFirst:
    """Why the divergence is this record and not the first failing one (``failing``): it ran in
    ``candidate`` vs ``baseline`` dtype and passed only under the ``tolerance`` dtype's looser
    bound, before ``failing`` failed under its own ``failing_dtype``'s."""

    candidate: str
    baseline: str
    tolerance: str
    failing: str
    failing_dtype: str


@dataclass(frozen=True)
class ApiCallEarlier:
    """Why the divergence starts outside this record's module: the API call ``op`` (its label,
    ``Divergence.first_op``) diverged earlier, outside it."""

    op: str


# How the first divergence's record was chosen, when it is not simply the first failing one.
RecordChoice = LowerPrecisionFirst | ApiCallEarlier


# What ``CaseOrigin.module`` is: the innermost module whose inputs all matched, or (none was
# recorded) the first divergent paired module.
OriginRole = Literal["matched_inputs", "first_paired"]


@dataclass(frozen=True)
class CaseOrigin:
    """Where a case's divergence enters: ``module`` (the record's own module when it is the
    origin, else the innermost enclosing module whose inputs matched), in ``phase`` at
    ``step``; ``record`` is the first failing record there, ``kind`` its kind; ``aside``: the
    module's inputs set aside (not data, their form changed), by slot name."""

    module: str
    phase: Phase
    kind: Kind
    step: int
    record: str
    evidence: OriginProof
    proven: bool
    role: OriginRole = "matched_inputs"
    aside: tuple[str, ...] = ()

    def as_dict(self, evidence: str) -> dict[str, object]:
        """report.json's origin; ``evidence``: this origin's evidence in words
        (``reports.origin_text.case_origin_text``)."""
        out = field_dict(self, omit=("role", "aside"))
        out["evidence"] = evidence  # in the fact's place
        return out
