"""Coverage: how much of a phase was compared at all. A phase whose records found no partner
on the other side has no evidence of alignment, whatever its compared records say: nothing
compared, or too little (under a floor), fails the phase.

The ratio is over the baseline's *output* records of the phase (forward: activations, logits,
loss; backward: grads; step: parameters): the share of them paired with a candidate record and
compared. A record whose two sides hold evidence of kinds that cannot be compared (a checksum
against statistics) is *not compared*: it counts against the ratio, and the problem says why.
A step that one side recorded and the other did not fails the phase, naming the step.

A baseline record standing for several (``trace/merged_stats``: q/k/v outputs merged to meet
a fused qkv record) counts as the records it stands for, and the coverage says how many were
compared only by merged statistics.

What fails the phase is a fact (``CoverageProblem``: a small dataclass per kind, the numbers are
the coverage's own); its words are made when rendered (``reports.coverage_text``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ..compare.pairs import PairResult
from ..trace.note_blocks import MissingGrads
from ..trace.records import Record
from ..vocabulary import GATE_KINDS, Phase
from .run_findings import StepsOneSided

RecordLevel = Literal["modules", "APIs", ""]  # one side's unmatched records: all modules, all APIs, mixed


@dataclass(frozen=True)
class PairingHint:
    """Why the sides may not pair: an L0 (modules) dump against an L1 (APIs) dump
    (``levels_differ``), a candidate that recorded none of the baseline's records
    (``candidate_none``; all API calls when ``baseline`` is "APIs"), names that differ
    (``names_differ``). ``baseline``/``candidate``: the level of each side's unmatched records."""

    why: Literal["levels_differ", "candidate_none", "names_differ"]
    baseline: RecordLevel = ""
    candidate: RecordLevel = ""


@dataclass(frozen=True)
class NothingComparable:
    """Nothing compared: every paired baseline output record has evidence of kinds that cannot
    be compared (``Coverage.uncompared`` of them, the first one's kinds in ``uncompared_why``)."""


@dataclass(frozen=True)
class NothingRecorded:
    """Nothing compared: neither side recorded an output record of the phase."""


@dataclass(frozen=True)
class NothingPaired:
    """Nothing compared: no baseline output record found a partner (or the baseline recorded
    none while the candidate did)."""

    hint: PairingHint | None = None


@dataclass(frozen=True)
class TooLittle:
    """Some compared, but the share paired is under the floor (``min_coverage``)."""

    hint: PairingHint | None = None


@dataclass(frozen=True)
class GradsMissing:
    """A side's recorder found its parameter grads gone (the manifest's ``grads_missing``)."""

    missing: tuple[tuple[str, MissingGrads], ...]  # (side, note)


# A step one side only recorded records of: the run verdict's fact (``StepsOneSided``), of a phase.
CoverageProblem = (
    StepsOneSided | NothingComparable | NothingRecorded | NothingPaired | TooLittle | GradsMissing
)


@dataclass(frozen=True)
class Coverage:
    """The paired and unmatched output records of one phase, and whether that is enough."""

    phase: Phase
    outputs: int  # baseline output records of the phase
    paired: int  # of them, paired with a candidate record
    only_baseline: int
    only_candidate: int
    unexplained_baseline: int  # unmatched, and no mapping rule or reason says why
    unexplained_candidate: int
    floor: float  # the minimum ratio (min_coverage)
    problem: CoverageProblem | None = None  # what fails the phase (None when nothing does)
    uncompared: int = 0  # paired by name, but their evidence kinds cannot be compared
    # The first such record's kinds, "xor checksum vs statistics": cut from the compare layer's
    # note, the only place they are held (``compare.pairs.evidence_kind`` gives them as words,
    # ``PairResult`` keeps no typed kinds); the renderer says them as they are.
    uncompared_why: str = ""
    merged: int = 0  # of the paired, compared by statistics merged from several records

    @property
    def ratio(self) -> float:
        """paired / outputs (0.0 when the baseline has no output record: nothing to vouch)."""
        return self.paired / self.outputs if self.outputs else 0.0

    @property
    def unexplained(self) -> int:
        return self.unexplained_baseline + self.unexplained_candidate

    @property
    def ok(self) -> bool:
        return self.problem is None

    def as_dict(self, problem: str) -> dict[str, object]:
        """The coverage for report.json; ``problem``: the problem in words
        (``reports.coverage_text.coverage_problem_text``)."""
        return {
            "ratio": self.ratio,
            "floor": self.floor,
            "baseline_outputs": self.outputs,
            "paired": self.paired,
            "only_baseline": self.only_baseline,
            "only_candidate": self.only_candidate,
            "unexplained_baseline": self.unexplained_baseline,
            "unexplained_candidate": self.unexplained_candidate,
            "not_compared": self.uncompared,
            "not_compared_why": self.uncompared_why,
            "merged_statistics": self.merged,
            "passed": self.ok,
            "problem": problem,
        }


def measure_coverage(pairs: Sequence[PairResult], phase: Phase, floor: float) -> Coverage:
    """The coverage of ``phase`` from its pair results; an unmatched record whose note says
    nothing (no mapping rule or reason) is unexplained."""
    kinds = GATE_KINDS[phase]
    outputs = [p for p in pairs if p.record.kind in kinds]
    base = [p for p in outputs if p.status != "only_candidate"]
    paired = sum(_stands_for(p) for p in base if p.paired)
    only_b = [p.record for p in outputs if p.status == "only_baseline"]
    only_c = [p.record for p in outputs if p.status == "only_candidate"]
    uncompared = [p for p in base if p.status == "not_compared"]
    cov = Coverage(
        phase=phase,
        outputs=sum(_stands_for(p) for p in base),
        paired=paired,
        only_baseline=len(only_b),
        only_candidate=len(only_c),
        unexplained_baseline=sum(1 for p in outputs if p.status == "only_baseline" and not p.note),
        unexplained_candidate=sum(1 for p in outputs if p.status == "only_candidate" and not p.note),
        floor=floor,
        merged=sum(_stands_for(p) for p in base if p.paired and p.evidence == "merged_stats"),
        uncompared=len(uncompared),
        uncompared_why=uncompared[0].note.removeprefix("cannot be compared (").rstrip(")")
        if uncompared
        else "",
    )
    return replace(cov, problem=_one_sided_step(pairs) or _problem(cov, only_b, only_c))


def _stands_for(pair: PairResult) -> int:
    """How many of the baseline's records ``pair``'s record stands for (merged ones: several)."""
    return max(1, len(pair.record.merged))


def _one_sided_step(pairs: Sequence[PairResult]) -> StepsOneSided | None:
    """A step that one side recorded records of and the other did not."""
    base = {p.record.step for p in pairs if p.status != "only_candidate"}
    cand = {(p.candidate or p.record).step for p in pairs if p.status != "only_baseline"}
    for side, mine, other in (("baseline", base, cand), ("candidate", cand, base)):
        missing = sorted(mine - other)
        if missing and other:
            return StepsOneSided(side, tuple(missing))
    return None


def _problem(cov: Coverage, only_b: Sequence[Record], only_c: Sequence[Record]) -> CoverageProblem | None:
    if cov.paired == 0 and cov.uncompared:
        return NothingComparable()
    if cov.paired == 0:
        if cov.outputs == 0 and cov.only_candidate == 0:
            return NothingRecorded()
        return NothingPaired(_hint(only_b, only_c))
    if cov.ratio < cov.floor:
        return TooLittle(_hint(only_b, only_c))
    return None


def _level(records: Sequence[Record]) -> RecordLevel:
    """ "modules", "APIs" or "" (mixed, or none) for one side's unmatched records."""
    api = {r.module_class == "api" for r in records}
    if api == {False}:
        return "modules"
    if api == {True}:
        return "APIs"
    return ""


def _hint(only_b: Sequence[Record], only_c: Sequence[Record]) -> PairingHint | None:
    """Why the sides may not pair: an L0 (modules) dump against an L1 (APIs) dump, or a
    candidate that recorded nothing."""
    base, cand = _level(only_b), _level(only_c)
    if {base, cand} == {"modules", "APIs"}:
        return PairingHint("levels_differ", base, cand)
    if only_b and not only_c:
        return PairingHint("candidate_none", base, cand)
    if only_b and only_c:
        return PairingHint("names_differ", base, cand)
    return None
