"""example_suites/training's faulty cases pass with their ``expect:``: the three whose fault
is in the candidate's optimizer or scheduler (faults.py patches LambdaLR / AdamW for that
model) are stopped by the contract check before step 0 with nothing trained; the layer bug
from step 5 is found in the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.text import PhaseReport
from pytest_precalign.run.case import run_case
from pytest_precalign.run.outcome import CaseRun

SUITE = Path(__file__).resolve().parents[2] / "example_suites" / "training" / "align.yaml"


def _run(name: str) -> tuple[CaseRun, list[bool]]:
    config = load_config_file(SUITE)
    run = run_case(config, next(c for c in config.cases if c.name == name))
    reports = [
        PhaseReport.of_run(run, p, defined_in=str(SUITE), baseline="b", candidate="c", reproduce="r")
        for p in run.phases
    ]
    return run, [phase_outcome(r).passed for r in reports]


@pytest.mark.parametrize(
    ("name", "step", "origin"),
    [
        ("warmup_one_step_behind", 1, "lr"),
        ("decay_horizon_shortened_by_warmup", 3, "lr"),
        ("weight_decay_on_norms", 0, "weight_decay"),
    ],
)
def test_optimizer_faults_are_stopped_by_the_contract_before_step_0(
    name: str, step: int, origin: str
) -> None:
    run, passed = _run(name)
    assert all(passed)
    assert run.training is not None and run.training.first is not None and run.training.met
    first = run.training.first
    assert (first.step, first.what, first.origin, run.training.steps_compared) == (
        step,
        "settings",
        origin,
        0,
    )
    assert run.baseline.records == () and run.candidate.records == ()  # nothing trained


@pytest.mark.slow  # 10 steps of two tiny Qwen2.5s
def test_a_layer_bug_from_step_5_is_still_found_in_the_run() -> None:
    run, passed = _run("layer_bug_from_step_5")
    assert all(passed), run.training
    assert run.training is not None and run.training.first is not None
    assert (run.training.first.step, run.training.first.what) == (5, "forward")
