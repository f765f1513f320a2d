"""A loss computed outside the model (TRL 0.7's DPOTrainer: the model called without labels, no
loss record), whose value matches while its gradient does not (the IPO bug at step 0, trl PR
#1265): the grad arriving at the model's output is made by no module, so the run verdict names
the loss. A fault inside the head still names the head; a missing forward record names nothing
more than the backward. Real recordings: ``Recorder`` in a plain loop, judged by ``precalign
compare``."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


class _ScaleGrad(torch.autograd.Function):
    """Identity forward, the grad's first column scaled by ``factor`` on the way back."""

    @staticmethod
    def forward(ctx: Any, x: Any, factor: float) -> Any:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, None]:
        scale = torch.ones(grad.shape[-1])
        scale[0] = ctx.factor
        return grad * scale, None


class Head(torch.nn.Module):
    def __init__(self, fault: bool) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 5)
        self.fault = fault

    def forward(self, x: Any) -> Any:
        y = self.proj(x)
        return _ScaleGrad.apply(y, 3.0) if self.fault else y


class Tiny(torch.nn.Module):
    """body, then head: head's output is the model's output (the logits)."""

    def __init__(self, fault: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Linear(6, 8)
        self.head = Head(fault)

    def forward(self, x: Any) -> Any:
        return self.head(torch.tanh(self.body(x)))


def record(
    root: Path,
    *,
    extra_grad: float = 0.0,
    head_fault: bool = False,
    steps: int = 2,
    scale: float = 1.0,
    grad_scale: float = 1.0,
) -> Path:
    """A plain loop whose loss is made from the logits outside the model; ``extra_grad`` adds
    ``extra_grad * (logits - logits.detach()).sum()``: exactly 0 in value, not in gradient;
    ``scale`` multiplies the loss (its value and its gradient), ``grad_scale`` its gradient only."""
    from pytest_precalign import Recorder

    model = Tiny(head_fault)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    with Recorder(root, mode="stats") as rec:
        for _ in range(steps):
            rec.start(model)
            logits = model(x)
            loss = logits.pow(2).mean() * scale
            if extra_grad:
                loss = loss + extra_grad * (logits - logits.detach()).sum()
            loss = loss + (grad_scale - 1.0) * (loss - loss.detach())
            loss.backward()
            rec.record_scalars(loss=loss.item())
            optimizer.step()
            optimizer.zero_grad()
            rec.stop()
            rec.step()
    return root


def verdict(tmp: Path, base: Path, cand: Path) -> tuple[int, dict[str, Any]]:
    from pytest_precalign.cli import main

    report = tmp / f"report-{cand.name}"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["compare", str(base), str(cand), "--report", str(report)])
    training: dict[str, Any] = json.loads((report / "report.json").read_text())["training"]
    return code, training


def told(training: dict[str, Any]) -> tuple[Any, Any, Any]:
    return training["first_divergent_step"], training["first_divergent"], training["origin"]


def test_a_loss_outside_the_model_equal_in_value_not_in_grad_is_the_loss(tmp_path: Path) -> None:
    base = record(tmp_path / "base")
    code, training = verdict(tmp_path, base, record(tmp_path / "cand", extra_grad=0.5))
    assert code == 1
    assert told(training) == (0, "loss", "loss")
    assert "the grad arriving at head's output (the model's output" in training["evidence"]
    assert "every forward record" in training["evidence"] and "logged loss" in training["evidence"]


def test_a_loss_gradient_scaled_by_one_factor_is_the_loss_with_the_factor(tmp_path: Path) -> None:
    # A loss scale not undone: every grad x2 from the model's output on, the logged loss equal.
    base = record(tmp_path / "base")
    code, training = verdict(tmp_path, base, record(tmp_path / "cand", grad_scale=2.0))
    assert code == 1
    assert told(training) == (0, "loss", "loss")
    assert "every grad scaled by one factor (x2)" in training["pattern"]


def test_a_loss_outside_the_model_that_differs_in_value_is_told_by_its_value(tmp_path: Path) -> None:
    base = record(tmp_path / "base")
    code, training = verdict(tmp_path, base, record(tmp_path / "cand", scale=2.0))
    assert code == 1
    assert told(training) == (0, "loss", "loss")
    assert training["evidence"].startswith("loss ") and "grad arriving" not in training["evidence"]


def test_a_fault_inside_the_head_stays_the_heads_backward(tmp_path: Path) -> None:
    base = record(tmp_path / "base")
    code, training = verdict(tmp_path, base, record(tmp_path / "cand", head_fault=True))
    assert code == 1
    assert told(training) == (0, "backward", "head")


def test_a_forward_record_missing_names_no_loss(tmp_path: Path) -> None:
    # The candidate's body not recorded (exclude=): its forward cannot vouch, nothing says the
    # grad at the head's output was not made inside the model.
    from pytest_precalign import Recorder

    base = record(tmp_path / "base")
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    with Recorder(tmp_path / "cand", mode="stats", exclude=("body",)) as rec:
        rec.start(model)
        logits = model(x)
        loss = logits.pow(2).mean() + 0.5 * (logits - logits.detach()).sum()
        loss.backward()
        rec.record_scalars(loss=loss.item())
        optimizer.step()
        rec.stop()
    code, training = verdict(tmp_path, base, tmp_path / "cand")
    assert code == 1
    assert training["first_divergent"] == "backward"
