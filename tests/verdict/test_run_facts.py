"""The training verdict holds facts; its words are made when rendered
(``verdict.run_findings``, ``reports.training_evidence_text``): each fact holds the sides, steps,
names and values its sentence states, the renderer says the sentence, and a verdict built from
facts renders as the terminal and report.json have always said it."""

from __future__ import annotations

import math
from pathlib import Path

from pytest_precalign.reports.training_evidence_text import finding_text, warning_text
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.reports.training_text import training_lines, training_summary
from pytest_precalign.verdict.run_findings import (
    BrokenAlike,
    PlanMissing,
    RecordedOneSide,
    ScalarOneSided,
    StepsOneSided,
    UpdateSkippedOneSide,
)
from pytest_precalign.verdict.training_run import TrainingVerdict

from .test_training_run import judge, run

VERDICT = Path(__file__).parents[2] / "src" / "pytest_precalign" / "verdict"


def test_a_run_that_does_not_line_up_holds_facts_not_sentences() -> None:
    cand = {s: x for s, x in run(grad_norm=lambda s: None, skipped=lambda s: s == 3).items() if s < 8}
    v = judge(run(skipped=lambda s: False), cand)
    assert v.findings == (
        StepsOneSided("baseline", (8, 9)),
        ScalarOneSided("grad_norm", "baseline", tuple(range(8))),
        UpdateSkippedOneSide("candidate", 3),
    )
    assert [finding_text(f) for f in v.findings] == [
        "steps 8-9 recorded by the baseline only: the runs' steps do not line up",
        "grad_norm recorded by the baseline only (steps 0-7): nothing to compare it with",
        "the candidate skipped the update of step 3 (an overflow?), the other did not: the steps after it do "
        "not line up",
    ]


def test_scalars_broken_alike_are_a_finding_with_their_numbers() -> None:
    nan = run(loss=lambda s: math.nan if s >= 7 else 5.0)
    v = judge(nan, nan)
    found = v.findings[0]
    assert isinstance(found, BrokenAlike) and not v.warnings
    assert (found.name, math.isnan(found.value), found.since, found.steps, found.common) == (
        "loss",
        True,
        7,
        3,
        10,
    )
    assert finding_text(v.findings[0]).startswith(
        "loss is nan on both sides from step 7 (3 of 10 step(s)): NaN/Inf"
    )


def test_a_verdict_built_from_facts_renders_as_before() -> None:
    v = TrainingVerdict(
        4,
        "approximate",
        None,
        findings=(RecordedOneSide("plan", "candidate"),),
        warnings=(
            BrokenAlike("loss", math.inf, 2, 2, 4, accepted=True),
            PlanMissing("baseline", "no scheduler"),
        ),
    )
    assert training_lines(v) == [
        "Warning: the baseline's recording has no training plan: no scheduler",
        "Runs do not line up: training plan recorded by the candidate only: the settings (contract) are not "
        "checked before step 0",
        "Warning: loss is inf on both sides from step 2 (2 of 4 step(s)): accepted by the table's equal_nan: true",
    ]
    assert training_summary(v) == (
        "; runs do not line up (1 finding(s): training plan recorded by the candidate only: the settings "
        "(contract) are not checked before step 0)"
    )
    told = training_dict(v)
    assert told["findings"] == [finding_text(v.findings[0])]
    assert told["warnings"] == [warning_text(w) for w in v.warnings]
