"""What StepEvidence costs a step: no parameter-sized allocation once its snapshot buffers
exist, a fixed number of host reads whatever the model's size, and the update and parameter
norms of the plain snapshot computation (``clone`` before the step, ``after - before`` after
it): from the C kernels, the exact norms within the stated bound; without them, torch's
``get_total_norm`` bit for bit. From the second step on, the last step's norms left the
snapshot (no copy at ``begin``) unless a parameter was written in place or reloaded since."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.chunked_stats import SUM_ULPS
from pytest_precalign.recording.host_sync import host_syncs
from pytest_precalign.steps.step_evidence import StepEvidence


def _model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(32, 32) for _ in range(layers)), torch.nn.LayerNorm(32))


def _backward(model: torch.nn.Module, step: int) -> None:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(step))
    model(x).pow(2).sum().backward()


class _Allocations(TorchDispatchMode):
    """The largest tensor an op returned in new storage (bytes), and the ``.item()``-style
    host reads."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.scalar_reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, evidence: StepEvidence, step: int) -> Any:
    optimizer.zero_grad(set_to_none=True)
    evidence.begin()
    _backward(model, step)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    evidence.grads_before_clip(norm=float(norm))
    evidence.grads_after_clip()
    optimizer.step()
    return evidence.finish(step)


@pytest.mark.parametrize("kernels", ["native", "torch"])
def test_update_and_param_norms_are_the_snapshot_computations(
    kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kernels == "torch":
        monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    else:
        assert native_kernels.kernel_state() == "native", "this machine builds the C kernels"
    model = _model(3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    evidence = StepEvidence(model.parameters())
    for step in range(3):
        params = [p.detach() for p in model.parameters()]
        snapshot = [p.clone() for p in params]
        scalars = _step(model, optimizer, evidence, step)
        deltas = torch._foreach_sub(params, snapshot)
        if kernels == "torch":
            assert scalars.update_norm == float(torch.nn.utils.get_total_norm(deltas, 2.0)) > 0
            assert scalars.param_norm == float(torch.nn.utils.get_total_norm(params, 2.0))
            continue
        bound = SUM_ULPS * torch.finfo(torch.float32).eps
        for got, tensors in ((scalars.update_norm, deltas), (scalars.param_norm, params)):
            exact = math.sqrt(math.fsum(v * v for t in tensors for v in t.double().reshape(-1).tolist()))
            assert got is not None and exact > 0 and abs(got - exact) <= bound * exact


def test_a_step_allocates_no_parameter_sized_memory_after_the_first() -> None:
    model = _model(3)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    evidence = StepEvidence(model.parameters())
    _step(model, optimizer, evidence, 0)  # allocates the snapshot buffers (and the grads)
    smallest = min(p.numel() * p.element_size() for p in model.parameters())
    optimizer.zero_grad(set_to_none=False)
    _backward(model, 1)
    watch = _Allocations()
    with watch:
        evidence.begin()
        evidence.grads_before_clip()
        evidence.grads_after_clip()
        optimizer.step()
        evidence.finish(1)
    assert watch.largest < smallest  # scalars only: the norms, the counts


def test_host_reads_per_step_do_not_grow_with_the_model() -> None:
    reads = []
    for layers in (1, 6):
        model = _model(layers)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        evidence = StepEvidence(model.parameters())
        optimizer.zero_grad()
        evidence.begin()
        _backward(model, 0)
        watch, before = _Allocations(), host_syncs()
        with watch:
            evidence.grads_before_clip()  # the grad norm and the zero count: one read
            evidence.grads_after_clip()  # the norm after clipping
            optimizer.step()
            evidence.finish(0)  # the update and parameter norms: one read
        reads.append(watch.scalar_reads + host_syncs() - before)
    assert reads == [3, 3]


class _Ops(TorchDispatchMode):
    """The ops run under it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _copies(evidence: StepEvidence) -> int:
    """Copy ops ``evidence.begin()`` runs (the parameter snapshot)."""
    watch = _Ops()
    with watch:
        evidence.begin()
    return sum("copy" in name for name in watch.names)


def test_the_last_steps_norms_leave_the_next_snapshot_and_begin_copies_nothing() -> None:
    assert native_kernels.kernel_state() == "native", "this machine builds the C kernels"
    model = _model(3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    evidence = StepEvidence(model.parameters())
    assert _copies(evidence) == 1  # the first step: one foreach copy
    bound = SUM_ULPS * torch.finfo(torch.float32).eps
    for step in range(3):
        snapshot = [p.detach().clone() for p in model.parameters()]
        if step:
            assert _copies(evidence) == 0  # left by the last step's norms
        _backward(model, step)
        evidence.grads_before_clip()
        optimizer.step()
        update = evidence.finish(step).update_norm
        deltas = [p.detach().double() - b.double() for p, b in zip(model.parameters(), snapshot, strict=True)]
        exact = math.sqrt(math.fsum(v * v for d in deltas for v in d.reshape(-1).tolist()))
        assert update is not None and exact > 0 and abs(update - exact) <= bound * exact
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), evidence._buffers, strict=True))
        optimizer.zero_grad()


@pytest.mark.parametrize("write", ["in place", "load_state_dict"])
def test_a_parameter_written_between_steps_is_copied_again_and_not_counted_as_the_update(write: str) -> None:
    model = _model(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    evidence = StepEvidence(model.parameters())
    _step(model, optimizer, evidence, 0)  # leaves the next snapshot
    state = {k: v + 1.0 for k, v in model.state_dict().items()}
    with torch.no_grad():
        if write == "in place":
            next(model.parameters()).add_(1.0)
        else:
            model.load_state_dict(state)
    assert _copies(evidence) == 1  # the version counters moved: copied again
    snapshot = [p.detach().clone() for p in model.parameters()]
    _backward(model, 1)
    evidence.grads_before_clip()
    optimizer.step()
    update = evidence.finish(1).update_norm
    exact = math.sqrt(
        math.fsum(
            v * v
            for p, b in zip(model.parameters(), snapshot, strict=True)
            for v in (p.detach().double() - b.double()).reshape(-1).tolist()
        )
    )
    # the +1 written between the steps would add about sqrt(numel) to it
    assert update is not None and abs(update - exact) <= SUM_ULPS * torch.finfo(torch.float32).eps * exact


def test_a_write_through_data_between_steps_counts_in_the_next_update_norm() -> None:
    """``.data`` moves no version counter: the parameters moved that much since the last
    step's end, and the update norm says so (documented in ``StepEvidence.begin``)."""
    assert native_kernels.kernel_state() == "native", "this machine builds the C kernels"
    model = _model(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the optimizer moves nothing
    evidence = StepEvidence(model.parameters())
    _step(model, optimizer, evidence, 0)
    first = next(model.parameters())
    first.data.add_(0.5)
    assert _copies(evidence) == 0
    _backward(model, 1)
    evidence.grads_before_clip()
    optimizer.step()
    update = evidence.finish(1).update_norm
    expected = 0.5 * math.sqrt(first.numel())
    assert update is not None and abs(update - expected) <= 1e-6 * expected
