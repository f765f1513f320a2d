"""Grads of tensors modified in place after a module (issue #18 item 3). The output of
``nn.Linear`` on a 3-d input is a view; an in-place op on it (``h.add_()``,
``ReLU(inplace=True)``, ``x.mul_()`` on a module's input) rebases autograd's history and the
tensor hooks on it never fired: the grad_output of the module that made it and the grad_input
of the module that took it vanished, with no unmatched entry. Now they are taken from the
base's autograd node and equal, bit for bit, the grads of the same model written out of place."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.case import check_modules
from pytest_precalign.trace.records import Trace
from tests.helpers.inplace_nets import INPLACE_NETS, VANISHED, BadReluInplace, RealViewScaled, ReluInplace

PHASES = ("forward", "backward", "step")


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(1))


def _trace(model: nn.Module, mode: str = "tensor", level: str = "module") -> Trace:
    with HookRecorder(model, mode=mode, level=level) as rec:
        model(_x()).pow(2).mean().backward()
    return rec.trace()


def _grads(trace: Trace) -> dict[tuple[str, str, str, int], torch.Tensor]:
    return {
        (r.name, r.kind, r.slot, r.call): trace.tensors[r.tensor_key]
        for r in trace.records
        if r.kind in ("grad_output", "grad_input", "param_grad")
    }


@pytest.mark.parametrize("name", sorted(INPLACE_NETS))
def test_grads_around_an_inplace_op_equal_those_of_the_out_of_place_model(name: str) -> None:
    inplace_net, plain_net = INPLACE_NETS[name]
    inplace, plain = _grads(_trace(inplace_net())), _grads(_trace(plain_net()))
    assert sorted(inplace) == sorted(plain)  # before: 1-2 grad records missing per model
    assert [k for k in plain if not torch.equal(inplace[k], plain[k])] == []
    assert VANISHED[name] <= {k[:2] for k in inplace}


@pytest.mark.parametrize("level", ["op", "mix"])
def test_op_level_grads_around_an_inplace_op_are_recorded(level: str) -> None:
    inplace_net, plain_net = INPLACE_NETS["relu_inplace"]
    inplace = _trace(inplace_net(), level=level)
    linear = [r for r in inplace.records if r.name == "fc.Functional.linear"]
    assert sorted(r.kind for r in linear) == ["activation", "grad_output"]
    assert "not_recordable" not in inplace.manifest


def test_the_same_inplace_model_on_both_sides_is_aligned() -> None:
    run = check_modules(ReluInplace(), ReluInplace(), {"x": _x()}, phases=PHASES)
    assert all(v.passed for v in run.verdicts.values())
    backward = {p.record.id for p in run.comparison.pairs if p.paired and p.record.phase == "backward"}
    assert {"fc|grad_output|out|0|0", "act|grad_input|in.0|0|0"} <= backward


def test_a_wrong_grad_of_an_inplace_module_is_caught_there() -> None:
    run = check_modules(ReluInplace(), BadReluInplace(), {"x": _x()}, phases=PHASES)
    assert run.verdicts["forward"].passed
    first = run.verdicts["backward"].first
    assert first is not None
    # The first divergent backward record is one of the two grads that vanished before (the
    # same gradient: w.r.t. fc's output, which is act's input).
    assert (first.pair.record.name, first.pair.record.kind) in {("act", "grad_input"), ("fc", "grad_output")}
    failed = {p.record.id for p in run.comparison.pairs if p.paired and not p.passed}
    assert {"fc|grad_output|out|0|0", "act|grad_input|in.0|0|0"} <= failed


def test_hash_and_stats_modes_record_the_same_grads() -> None:
    inplace_net, _ = INPLACE_NETS["relu_inplace"]
    ids = {
        m: sorted(r.id for r in _trace(inplace_net(), mode=m).records) for m in ("stats", "hash", "tensor")
    }
    assert ids["stats"] == ids["hash"] == ids["tensor"]


def test_a_grad_that_cannot_be_read_out_is_reported_not_recordable() -> None:
    trace = _trace(RealViewScaled())
    rid = "to_real|grad_output|out|0|0"
    assert rid not in {r.id for r in trace.records}
    assert trace.manifest["not_recordable"] == {
        rid: "not recordable: its view was modified in place and it has another dtype than its base"
    }
    # One side in place, the other not: the other side's record is unmatched with the reason
    # (explained), everything else compares.
    run = check_modules(RealViewScaled(), RealViewScaled(inplace=False), {"x": _x()}, phases=PHASES)
    only = {p.record.id: p.note for p in run.comparison.pairs if p.status == "only_candidate"}
    assert only == {rid: f"the baseline's grad is {trace.manifest['not_recordable'][rid]}"}
    assert all(v.passed for v in run.verdicts.values())
    assert run.verdicts["backward"].coverage.unexplained == 0
