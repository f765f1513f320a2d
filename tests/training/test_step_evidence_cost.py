"""What StepEvidence costs a step: no parameter-sized allocation once its snapshot buffers
exist, a fixed number of host reads whatever the model's size, and the update and parameter
norms of the plain snapshot computation (``clone`` before the step, ``after - before`` after
it): from the C kernels, the exact norms within the stated bound; without them, torch's
``get_total_norm`` bit for bit."""

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
from pytest_precalign.training.step_evidence import StepEvidence


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
