"""A phase's coverage in words (the verdict holds the numbers and what fails the phase as a
fact: ``verdict.coverage``): the coverage line, and the problem — nothing compared, too little
compared, a step missing, parameter grads missing — with the hint why the sides may not pair,
as the terminal, the JUnit properties and report.json say them."""

from __future__ import annotations

from ..verdict.coverage import (
    Coverage,
    CoverageProblem,
    GradsMissing,
    NothingComparable,
    NothingPaired,
    NothingRecorded,
    PairingHint,
    TooLittle,
)
from ..verdict.run_findings import StepsOneSided


def pct(x: float) -> str:
    """A share as a percentage; never rounds a share below 1 up to 100%, or above 0 down to 0%."""
    text = f"{100 * x:.0f}%"
    if text == "100%" and x < 1:
        return "99%"
    if text == "0%" and x > 0:
        return "<1%"
    return text


def coverage_text(cov: Coverage) -> str:
    """``coverage 75% (3 of 4 baseline forward output records paired; floor 50%)``."""
    text = (
        f"coverage {pct(cov.ratio)} ({cov.paired} of {cov.outputs} baseline {cov.phase} "
        f"output records paired; floor {pct(cov.floor)})"
    )
    text += f"; {cov.merged} by merged statistics" if cov.merged else ""
    return text + (f"; {cov.uncompared} not compared ({cov.uncompared_why})" if cov.uncompared else "")


def coverage_problem_text(cov: Coverage) -> str:
    """What fails the phase for want of evidence, ``nothing compared: ...`` ("" when nothing does)."""
    return "" if cov.problem is None else _problem_text(cov, cov.problem)


def _problem_text(cov: Coverage, problem: CoverageProblem) -> str:
    if isinstance(problem, StepsOneSided):
        return _step_missing(problem, cov)
    if isinstance(problem, GradsMissing):
        return _grads_missing(problem)
    if isinstance(problem, NothingComparable):
        return (
            f"nothing compared: {cov.uncompared} of {cov.outputs} baseline {cov.phase} output records "
            f"have evidence that cannot be compared ({cov.uncompared_why})"
        )
    if isinstance(problem, NothingRecorded):
        return f"nothing compared: neither side recorded a {cov.phase} output record"
    if isinstance(problem, NothingPaired):
        return f"nothing compared: {_found(cov)}{_hint(problem.hint)}"
    return _too_little(problem, cov)


def _step_missing(problem: StepsOneSided, cov: Coverage) -> str:
    one = len(problem.steps) == 1
    steps = ", ".join(map(str, problem.steps))
    return (
        f"a step missing: {'step' if one else 'steps'} {steps} {'was' if one else 'were'} recorded by the "
        f"{problem.side} only (the other side has no {cov.phase} record of {'it' if one else 'them'})"
    )


def _grads_missing(problem: GradsMissing) -> str:
    notes = [
        f"the {side} recorded no parameter grad at step {m.step} (rank {m.rank}; "
        f"{m.count} parameters, e.g. {', '.join(m.names)}): {m.why}"
        for side, m in problem.missing
    ]
    return "param grads missing: " + "; ".join(notes)


def _found(cov: Coverage) -> str:
    found = (
        f"all {cov.outputs} baseline {cov.phase} output records found no partner"
        if cov.outputs
        else f"the baseline recorded no {cov.phase} output record"
    )
    return found + (f" ({cov.only_candidate} candidate-only)" if cov.only_candidate else "")


def _too_little(problem: TooLittle, cov: Coverage) -> str:
    not_compared = f"; {cov.uncompared} cannot be compared ({cov.uncompared_why})" if cov.uncompared else ""
    return (
        f"too little compared: {cov.paired} of {cov.outputs} baseline {cov.phase} output records "
        f"paired ({pct(cov.ratio)}, under the floor of {pct(cov.floor)}); {cov.only_baseline} "
        f"found no partner{_hint(problem.hint)}{not_compared} (min_coverage sets the floor)"
    )


def _hint(hint: PairingHint | None) -> str:
    """Why the sides may not pair, as a clause after the problem ("" without a hint)."""
    if hint is None:
        return ""
    if hint.why == "levels_differ":
        return (
            f"; the sides look like an L0 and an L1 dump (baseline: {hint.baseline} only, "
            f"candidate: {hint.candidate} only): record both at the same level"
        )
    if hint.why == "candidate_none":
        if hint.baseline == "APIs":
            return (
                "; the candidate recorded none of them, all API calls: a mix or L1 dump against an "
                "L0 one? (record both at the same level)"
            )
        return "; the candidate recorded none of them"
    return "; the names differ between the sides (a mapping rule missing or not applied?)"
