"""A training run verdict's findings, warnings and evidence in words, made when the verdict is
rendered (the verdict holds the facts: ``verdict.run_findings``, ``verdict.run_evidence``):
one function per field, used by the terminal, report.json, the HTML and the JUnit messages."""

from __future__ import annotations

from ..verdict.run_findings import (
    BrokenAlike,
    FrozenChanged,
    NotTrainingRun,
    PlanMissing,
    RecordedOneSide,
    RunFinding,
    RunWarning,
    ScalarOneSided,
    StepsOneSided,
    UpdateSkippedOneSide,
)

# Evidence checked before step 0, and the check that needs it on both sides.
_BEFORE_TRAINING = {
    "initial_params": ("initial parameters", "the initial weights are not compared"),
    "plan": ("training plan", "the settings (contract) are not checked before step 0"),
}


def finding_text(fact: RunFinding) -> str:
    """One thing the runs could not pair, in words."""
    match fact:
        case StepsOneSided(side, steps):
            return f"steps {ranges(steps)} recorded by the {side} only: the runs' steps do not line up"
        case ScalarOneSided(name, side, steps):
            return f"{name} recorded by the {side} only (steps {ranges(steps)}): nothing to compare it with"
        case UpdateSkippedOneSide(side, step):
            return (
                f"the {side} skipped the update of step {step} (an overflow?), the other did not: "
                "the steps after it do not line up"
            )
        case BrokenAlike():
            return _broken(fact)
        case RecordedOneSide(what, side):
            words, skipped = _BEFORE_TRAINING[what]
            return f"{words} recorded by the {side} only: {skipped}"
        case NotTrainingRun():
            return "the case is not a training run"
    assert isinstance(fact, FrozenChanged)
    return _frozen(fact)


def warning_text(fact: RunWarning) -> str:
    """One thing that passed only because the table opted in, or evidence a side lacks."""
    if isinstance(fact, PlanMissing):
        return f"the {fact.side}'s recording has no training plan: {fact.why}"
    return _broken(fact)


def _broken(fact: BrokenAlike) -> str:
    told = (
        f"{fact.name} is {fact.value:.6g} on both sides from step {fact.since} "
        f"({fact.steps} of {fact.common} step(s))"
    )
    if fact.accepted:
        return f"{told}: accepted by the table's equal_nan: true"
    return (
        f"{told}: NaN/Inf is not a value, two runs broken alike are not aligned "
        "(equal_nan: true on the table's rule for it accepts it, with a warning)"
    )


def _frozen(fact: FrozenChanged) -> str:
    head = f"frozen parameter {fact.name} changed on the {fact.side}: after step {fact.step} it is not "
    if fact.before is not None:
        return head + f"what it was after step {fact.before}"
    return head + f"its initial value (norm {fact.initial_norm:.6g} before training, {fact.norm:.6g} after)"


def ranges(steps: tuple[int, ...]) -> str:
    """``0-3, 5``: steps as runs of consecutive steps."""
    parts: list[str] = []
    start = prev = steps[0]
    for s in [*steps[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)
