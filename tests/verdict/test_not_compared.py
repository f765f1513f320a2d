"""What a run verdict did not compare is held as facts (``verdict/not_compared.py``) and told in
words only when rendered (``reports/not_compared_text.py``): the words report.json and the
messages have said since they were made in the verdict."""

from __future__ import annotations

from pytest_precalign.reports.not_compared_text import not_compared_text
from pytest_precalign.verdict.not_compared import (
    KindsNotRecorded,
    LayersOneSide,
    MicroBatchSplit,
    RowsSplit,
    not_compared,
)

HOW = "the baseline's 2 DP replicas joined x 1 micro-batch, the candidate's one replica x 2 micro-batches"


def test_what_was_not_compared_is_facts_told_in_words_when_rendered() -> None:
    grads = KindsNotRecorded(("grad_input", "grad_output"), "candidate", "not recorded in the graph")
    kinds = {"grad_input": grads, "grad_output": grads}  # two kinds, one reason: one fact
    facts = not_compared({"baseline": [2, 3]}, [1, 4], {"4": HOW}, kinds)
    assert facts == (LayersOneSide("baseline", (2, 3)), RowsSplit("4", HOW), MicroBatchSplit((1,)), grads)
    assert [not_compared_text(f) for f in facts] == [
        "the layers of step(s) 2, 3: the baseline recorded them, the candidate those steps' scalars only",
        f"the layers of step 4: {HOW}: their module calls hold other rows, not paired row by row "
        "(the step's parameters, reduced grads and scalars are judged)",
        "the layers of step(s) 1: the sides split them into other micro-batches (module calls cannot be "
        "paired call by call; with the loss per token over the step the split is no difference: the "
        "steps' scalars and parameters are judged)",
        "the grad_input and grad_output records: the candidate's were not recorded in the graph",
    ]
