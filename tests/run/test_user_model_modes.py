"""The user's model stays as the user built it: a compare runs in the mode the models are in
(or the one asked for) and leaves every submodule in the mode it had (issue #18, item 1)."""

from __future__ import annotations

import pytest
import torch

from pytest_precalign.errors import CaseError
from pytest_precalign.run.case import check_modules


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.drop(self.body(x))))


def _pair() -> tuple[Net, Net]:
    torch.manual_seed(0)
    a = Net()
    b = Net()
    b.load_state_dict(a.state_dict())
    return a, b


def _modes(model: torch.nn.Module) -> dict[str, bool]:
    return {name: m.training for name, m in model.named_modules()}


def test_train_mode_models_run_in_train_mode_and_stay_there() -> None:
    a, b = _pair()
    a.norm.eval()  # a submodule the user froze on purpose
    b.norm.eval()
    before = _modes(a)
    seen: list[bool] = []
    a.drop.register_forward_hook(lambda m, i, o: seen.append(m.training))
    run = check_modules(a, b, {"x": torch.randn(4, 8)}, phases=("forward", "backward"))
    assert seen == [True]  # dropout was active, as the user's model is in train mode
    assert run.verdicts["forward"].passed  # the same dropout draws on both sides (seeded)
    assert _modes(a) == before and _modes(b) == before


def test_eval_on_request_and_restored_after() -> None:
    a, b = _pair()
    seen: list[bool] = []
    a.drop.register_forward_hook(lambda m, i, o: seen.append(m.training))
    check_modules(a, b, {"x": torch.randn(4, 8)}, train=False)
    assert seen == [False]
    assert all(_modes(a).values()) and all(_modes(b).values())


def test_models_in_different_modes_need_train_given() -> None:
    a, b = _pair()
    b.eval()
    with pytest.raises(
        CaseError, match="baseline is in train mode and the candidate in eval mode; pass train="
    ):
        check_modules(a, b, {"x": torch.randn(4, 8)})
    assert a.training and not b.training


def test_modes_are_restored_when_the_model_raises() -> None:
    a, b = _pair()
    b.head = torch.nn.Linear(3, 4)  # wrong width: the candidate's forward raises
    b.eval()
    with pytest.raises(RuntimeError):
        check_modules(a, b, {"x": torch.randn(4, 8)}, train=True)
    assert not any(_modes(b).values())
