"""When parameter grads are recorded: ``param_grads="backward"`` (the default, as each backward
accumulates them) or ``"step"`` (once per step as the optimizer sees them: after the loop's
grad reduction, at ``Recorder.grads_ready()`` or else at ``stop()``; Megatron's ``main_grad``
where a parameter has one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.errors import ConfigError

torch = pytest.importorskip("torch")


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        return self.b(torch.tanh(self.a(x)))


def _grads(folder: Path) -> dict[tuple[str, int], Any]:
    from pytest_precalign.trace.native_io import read_trace

    trace = read_trace(folder)
    return {
        (r.name, r.call): torch.as_tensor(trace.tensor(r)) for r in trace.records if r.kind == "param_grad"
    }


def _step(model: Any, rec: Any, *, microbatches: int, reduce: bool, ready: bool) -> dict[str, Any]:
    """Forward and backward over micro-batches, then a "reduction" the loop makes (a real
    all-reduce of 2 equal ranks doubles a grad: here the loop doubles it), then AdamW."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    rec.start(model)
    for k in range(microbatches):
        model(torch.full((3, 4), 0.5 + k)).sum().backward()
    if reduce:
        for p in model.parameters():
            p.grad.mul_(2.0)
    seen = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    if ready:
        rec.grads_ready()
    optimizer.step()
    rec.stop()
    rec.step()
    return seen


def test_step_mode_records_the_reduced_grads_the_optimizer_steps_on(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Tiny()
    rec = Recorder(tmp_path / "step", mode="tensor", param_grads="step")
    seen = _step(model, rec, microbatches=2, reduce=True, ready=True)
    grads = _grads(tmp_path / "step" / "step0" / "rank0")
    # one record per parameter (call 0), the grad after the reduction, bitwise
    assert set(grads) == {(n, 0) for n in seen}
    assert all(torch.equal(grads[(n, 0)], g) for n, g in seen.items())
    assert all(len(p._post_accumulate_grad_hooks or {}) == 0 for p in model.parameters())


def test_backward_mode_stays_the_default_and_records_before_the_reduction(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Tiny()
    rec = Recorder(tmp_path / "bw", mode="tensor")
    seen = _step(model, rec, microbatches=2, reduce=True, ready=False)
    grads = _grads(tmp_path / "bw" / "step0" / "rank0")
    # each micro-batch's accumulation is a call; the last one is half the reduced grad
    assert set(grads) == {(n, c) for n in seen for c in (0, 1)}
    assert all(torch.equal(grads[(n, 1)] * 2.0, g) for n, g in seen.items())
    with pytest.raises(ConfigError, match=r'grads_ready: needs Recorder\(\.\.\., param_grads="step"\)'):
        rec.grads_ready()


def test_step_mode_without_grads_ready_records_at_stop_and_prefers_main_grad(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Tiny()
    main_grad = torch.arange(8.0).reshape(2, 4)
    model.b.weight.main_grad = main_grad  # Megatron's DDP keeps the reduced grad here
    rec = Recorder(tmp_path / "stop", mode="tensor", param_grads="step")
    seen = _step(model, rec, microbatches=1, reduce=False, ready=False)
    grads = _grads(tmp_path / "stop" / "step0" / "rank0")
    assert torch.equal(grads[("b.weight", 0)], main_grad)
    assert torch.equal(grads[("a.weight", 0)], seen["a.weight"])
    assert len(grads) == len(seen)


def test_grads_ready_twice_and_an_unknown_mode_are_refused(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    with pytest.raises(ConfigError, match=r"unknown param_grads 'after' \(allowed: backward, step\)"):
        Recorder(tmp_path, param_grads="after")
    model = Tiny()
    rec = Recorder(tmp_path / "twice", param_grads="step", steps=[1])
    rec.start(model)  # step 0 is not recorded: grads_ready does nothing
    rec.grads_ready()
    rec.stop()
    rec.step()
    rec.start(model)
    model(torch.ones(1, 4)).sum().backward()
    rec.grads_ready()
    with pytest.raises(ConfigError, match="called twice in step 1"):
        rec.grads_ready()
    rec.close()
