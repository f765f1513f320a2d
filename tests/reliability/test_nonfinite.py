"""NaN/Inf anywhere (inputs, weights, grads; on both sides or one) is reported as nonfinite
(the first NaN/Inf per side, verdict.py), in every record mode -- never a crash, and the
failure message and report.json are still written."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pytest_precalign.config.specs import RecordSpec
from pytest_precalign.reports.document import phase_dict, write_reports
from pytest_precalign.reports.text import PhaseReport, failure_message
from pytest_precalign.run.case import CaseRun, check_modules


class NaNGrad(torch.autograd.Function):
    """Identity forward; its backward returns NaN (a broken custom kernel)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return torch.full_like(g, float("nan"))


class BadBackward(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NaNGrad.apply(x)


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


def _model(middle: torch.nn.Module | None = None) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 8), middle or Identity(), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )


def _x(value: float | None = None) -> torch.Tensor:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    if value is not None:
        x[0, 1] = value
    return x


def _poison(model: torch.nn.Module, value: float) -> torch.nn.Module:
    with torch.no_grad():
        model[0].weight[1, 2] = value  # type: ignore[index]
    return model


# (id, baseline, candidate, input, expected first NaN/Inf: side -> (record name, kind))
SCENARIOS: list[
    tuple[
        str,
        Callable[[], torch.nn.Module],
        Callable[[], torch.nn.Module],
        torch.Tensor,
        dict[str, tuple[str, str]],
    ]
] = [
    (
        "nan-input-both",
        _model,
        _model,
        _x(float("nan")),
        {"baseline": ("0", "activation"), "candidate": ("0", "activation")},
    ),
    (
        "inf-input-both",
        _model,
        _model,
        _x(float("inf")),
        {"baseline": ("0", "activation"), "candidate": ("0", "activation")},
    ),
    (
        "nan-weight-both",
        lambda: _poison(_model(), float("nan")),
        lambda: _poison(_model(), float("nan")),
        _x(),
        {"baseline": ("0", "activation"), "candidate": ("0", "activation")},
    ),
    (
        "inf-weight-candidate",
        _model,
        lambda: _poison(_model(), float("inf")),
        _x(),
        {"candidate": ("0", "activation")},
    ),
    (
        "nan-weight-baseline",
        lambda: _poison(_model(), float("nan")),
        _model,
        _x(),
        {"baseline": ("0", "activation")},
    ),
    # The grad w.r.t. the input of "1" is the grad w.r.t. the output of "0": one tensor,
    # recorded once, as the first record that saw it.
    ("nan-grad-candidate", _model, lambda: _model(BadBackward()), _x(), {"candidate": ("0", "grad_output")}),
]


def _check(run: CaseRun, tmp_path: Path) -> None:
    """Every phase has a verdict whose message and JSON can be written."""
    entries = []
    for phase in run.phases:
        report = PhaseReport("cfg", run.name, phase, run.verdicts[phase], "b", "c", run.table, "again")
        if not report.verdict.passed:
            assert "Traceback" not in failure_message(report)
        entries.append(phase_dict(report))
    path = write_reports(tmp_path, entries, {})
    json.loads(path.read_text())  # strict JSON: NaN/Inf written as strings


@pytest.mark.parametrize("mode", ["stats", "tensor", "hash"])
@pytest.mark.parametrize(
    ("baseline", "candidate", "x", "expected"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS]
)
def test_nonfinite_is_reported_not_a_crash(
    tmp_path: Path,
    mode: str,
    baseline: Callable[[], torch.nn.Module],
    candidate: Callable[[], torch.nn.Module],
    x: torch.Tensor,
    expected: dict[str, tuple[str, str]],
) -> None:
    run = check_modules(
        baseline(),
        candidate(),
        {"input": x},
        phases=("forward", "backward", "step"),
        record=RecordSpec(mode=mode),
    )
    _check(run, tmp_path)
    phase = "backward" if any(kind.startswith("grad") for _, kind in expected.values()) else "forward"
    verdict = run.verdicts[phase]
    found = {nf.side: (nf.record.name, nf.record.kind) for nf in verdict.nonfinite}
    assert found == expected
    one_sided = len(expected) == 1
    # NaN/Inf on one side only is a divergence, at the record where it appears; a NaN grad
    # made by module "1"'s backward is named there, as the origin (its grad_output matched).
    if one_sided:
        assert not verdict.passed
        assert verdict.first is not None
        first = (verdict.first.name, verdict.first.kind, verdict.first.origin)
        name, kind = next(iter(expected.values()))
        assert first == ((name, kind, True) if kind == "activation" else ("1", "grad_input", True))
    report = PhaseReport("cfg", run.name, phase, verdict, "b", "c", run.table, "again")
    text = failure_message(report) if not verdict.passed else ""
    for side, (name, _) in expected.items():
        if text:
            assert f"NaN/Inf first appears in the {side} at {name}" in text
