"""What a run verdict did not compare, in words, made when the verdict is rendered (the verdict
holds the facts: ``verdict.not_compared``)."""

from __future__ import annotations

from ..verdict.not_compared import KindsNotRecorded, LayersOneSide, MicroBatchSplit, NotCompared, RowsSplit

_OTHER = {"baseline": "candidate", "candidate": "baseline"}


def not_compared_text(fact: NotCompared) -> str:
    """One thing not compared, and why."""
    if isinstance(fact, LayersOneSide):
        return (
            f"the layers of step(s) {', '.join(map(str, fact.steps))}: "
            f"the {fact.side} recorded them, the {_OTHER[fact.side]} those steps' scalars only"
        )
    if isinstance(fact, RowsSplit):
        return (
            f"the layers of step {fact.step}: {fact.how}: their module calls hold other rows, not paired "
            "row by row (the step's parameters, reduced grads and scalars are judged)"
        )
    if isinstance(fact, MicroBatchSplit):
        return (
            f"the layers of step(s) {', '.join(map(str, fact.steps))}: "
            "the sides split them into other micro-batches (module calls cannot be paired call "
            "by call; with the loss per token over the step the split is no difference: the "
            "steps' scalars and parameters are judged)"
        )
    assert isinstance(fact, KindsNotRecorded)
    return f"the {' and '.join(fact.kinds)} records: the {fact.side}'s were {fact.why}"
