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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..compare.pairs import PairResult
from ..trace.records import Record
from ..vocabulary import GATE_KINDS, Phase


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
    problem: str = ""  # why the coverage fails the phase ("" when it does not)
    uncompared: int = 0  # paired by name, but their evidence kinds cannot be compared
    # The first such record's kinds, "xor checksum vs statistics": cut from the compare layer's
    # note, the only place they are held (``compare.pairs.evidence_kind`` gives them as words,
    # ``PairResult`` keeps no typed kinds); ``problem`` and ``describe`` are sentences here too.
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
        return not self.problem

    def describe(self) -> str:
        """``coverage 75% (3 of 4 baseline forward output records paired; floor 50%)``."""
        text = (
            f"coverage {_pct(self.ratio)} ({self.paired} of {self.outputs} baseline {self.phase} "
            f"output records paired; floor {_pct(self.floor)})"
        )
        text += f"; {self.merged} by merged statistics" if self.merged else ""
        return text + (f"; {self.uncompared} not compared ({self.uncompared_why})" if self.uncompared else "")

    def as_dict(self) -> dict[str, object]:
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
            "problem": self.problem,
        }


def _pct(x: float) -> str:
    """A share as a percentage; never rounds a share below 1 up to 100%, or above 0 down to 0%."""
    text = f"{100 * x:.0f}%"
    if text == "100%" and x < 1:
        return "99%"
    if text == "0%" and x > 0:
        return "<1%"
    return text


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
    return replace(cov, problem=_one_sided_step(pairs, phase) or _problem(cov, only_b, only_c))


def _stands_for(pair: PairResult) -> int:
    """How many of the baseline's records ``pair``'s record stands for (merged ones: several)."""
    return max(1, len(pair.record.merged))


def _one_sided_step(pairs: Sequence[PairResult], phase: Phase) -> str:
    """A step that one side recorded records of and the other did not."""
    base = {p.record.step for p in pairs if p.status != "only_candidate"}
    cand = {(p.candidate or p.record).step for p in pairs if p.status != "only_baseline"}
    for side, mine, other in (("baseline", base, cand), ("candidate", cand, base)):
        missing = sorted(mine - other)
        if missing and other:
            steps = ", ".join(map(str, missing))
            which = "step" if len(missing) == 1 else "steps"
            return (
                f"a step missing: {which} {steps} {'was' if len(missing) == 1 else 'were'} recorded by the "
                f"{side} only (the other side has no {phase} record of {'it' if len(missing) == 1 else 'them'})"
            )
    return ""


def _problem(cov: Coverage, only_b: Sequence[Record], only_c: Sequence[Record]) -> str:
    if cov.paired == 0 and cov.uncompared:
        return (
            f"nothing compared: {cov.uncompared} of {cov.outputs} baseline {cov.phase} output records "
            f"have evidence that cannot be compared ({cov.uncompared_why})"
        )
    if cov.paired == 0:
        if cov.outputs == 0 and cov.only_candidate == 0:
            return f"nothing compared: neither side recorded a {cov.phase} output record"
        found = (
            f"all {cov.outputs} baseline {cov.phase} output records found no partner"
            if cov.outputs
            else f"the baseline recorded no {cov.phase} output record"
        )
        found += f" ({cov.only_candidate} candidate-only)" if cov.only_candidate else ""
        return f"nothing compared: {found}{_hint(only_b, only_c)}"
    if cov.ratio < cov.floor:
        return (
            f"too little compared: {cov.paired} of {cov.outputs} baseline {cov.phase} output records "
            f"paired ({_pct(cov.ratio)}, under the floor of {_pct(cov.floor)}); {cov.only_baseline} "
            f"found no partner{_hint(only_b, only_c)}{_not_compared(cov)} (min_coverage sets the floor)"
        )
    return ""


def _not_compared(cov: Coverage) -> str:
    if not cov.uncompared:
        return ""
    return f"; {cov.uncompared} cannot be compared ({cov.uncompared_why})"


def _level(records: Sequence[Record]) -> str:
    """ "modules", "APIs" or "" (mixed, or none) for one side's unmatched records."""
    api = {r.module_class == "api" for r in records}
    if api == {False}:
        return "modules"
    if api == {True}:
        return "APIs"
    return ""


def _hint(only_b: Sequence[Record], only_c: Sequence[Record]) -> str:
    """Why the sides may not pair: an L0 (modules) dump against an L1 (APIs) dump, or a
    candidate that recorded nothing."""
    levels = (_level(only_b), _level(only_c))
    if set(levels) == {"modules", "APIs"}:
        return (
            f"; the sides look like an L0 and an L1 dump (baseline: {levels[0]} only, "
            f"candidate: {levels[1]} only): record both at the same level"
        )
    if only_b and not only_c:
        if levels[0] == "APIs":
            return (
                "; the candidate recorded none of them, all API calls: a mix or L1 dump against an "
                "L0 one? (record both at the same level)"
            )
        return "; the candidate recorded none of them"
    if only_b and only_c:
        return "; the names differ between the sides (a mapping rule missing or not applied?)"
    return ""
