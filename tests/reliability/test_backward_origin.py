"""A module whose backward is wrong is named as the origin of a backward divergence, even
though the grad it makes is the same tensor as its producer's grad_output (recorded first)."""

from __future__ import annotations

import pytest
import torch

from pytest_precalign.config.specs import RecordSpec
from pytest_precalign.run.case import check_modules


class ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, g: torch.Tensor) -> torch.Tensor:
        return g * 1.01


class Middle(torch.nn.Module):
    def __init__(self, wrong: bool) -> None:
        super().__init__()
        self.wrong = wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ScaleGrad.apply(x) if self.wrong else x.clone()


def _model(wrong: bool) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), Middle(wrong), torch.nn.Tanh(), torch.nn.Linear(8, 3))


@pytest.mark.parametrize("mode", ["stats", "tensor", "hash"])
def test_wrong_backward_is_the_origin(mode: str) -> None:
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    run = check_modules(
        _model(False),
        _model(True),
        {"input": x},
        phases=("forward", "backward"),
        record=RecordSpec(mode=mode),
    )
    assert run.verdicts["forward"].passed
    first = run.verdicts["backward"].first
    assert first is not None
    assert (first.name, first.kind, first.slot, first.origin) == ("1", "grad_input", "in.0", True)
