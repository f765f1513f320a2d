"""A multi-step case judged as a training run (run/outcome.py -> verdict/training_traces.py):
the first divergent step is named with what diverged first, later steps are downstream, and
report.json carries the run's ``training`` object."""

from __future__ import annotations

import torch

from pytest_precalign.config.specs import OptimizerSpec
from pytest_precalign.reports.document import report_document
from pytest_precalign.reports.outcome import phase_outcome
from pytest_precalign.reports.text import PhaseReport, failure_message
from pytest_precalign.reports.training_json import training_dict
from pytest_precalign.run.case import check_modules
from pytest_precalign.run.outcome import CaseRun


class LateBug(torch.nn.Module):
    """Scales its input by 1.01 from its ``start``-th call on: a bug that starts at a step."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start, self.calls = start, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 1.01 if self.calls > self.start else x


def model(start: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), LateBug(start), torch.nn.Linear(8, 4))


def run(start: int, steps: int = 8) -> CaseRun:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    return check_modules(
        model(10**6),
        model(start),
        {"input": x},
        phases=("forward", "backward", "step"),
        steps=steps,
        optimizer=OptimizerSpec(lr=1e-2),
        train=True,
    )


def report(case: CaseRun, phase: str) -> PhaseReport:
    return PhaseReport.of_run(case, phase, defined_in="t", baseline="b", candidate="c", reproduce="r")


def test_a_layer_bug_from_step_5_is_named_at_step_5_and_later_steps_are_downstream() -> None:
    case = run(start=5)
    assert case.training is not None and case.training.first is not None
    first = case.training.first
    assert (first.step, first.what, first.origin) == (5, "forward", "2")
    message = failure_message(report(case, "forward"))
    assert message.startswith(
        "Step 5 diverged first: forward, origin 2 — its inputs matched, its output did not"
    )
    assert "steps 6-7 are downstream of it" in message
    entry = phase_outcome(report(case, "forward")).entry
    assert entry is not None
    document = report_document([entry], {})
    training = document["training"]
    assert training["first_divergent_step"] == 5
    assert training["first_divergent"] == "forward"
    assert (training["origin"], training["lane"], training["steps_compared"]) == ("2", "approximate", 8)
    assert len(training["curves"]["loss"]["candidate"]) == 8


def test_a_clean_rerun_is_aligned_over_every_step() -> None:
    case = run(start=10**6, steps=4)
    assert case.training is not None and case.training.passed
    assert training_dict(case.training)["first_divergent_step"] is None
    assert all(report(case, p).passed for p in case.phases)


def test_a_forward_only_case_is_not_judged_as_a_training_run() -> None:
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    case = check_modules(model(10**6), model(10**6), {"input": x}, phases=("forward",), train=False)
    assert case.training is None
