"""``param_and_update_norms``: the parameter and update norms of a step taken parameter by
parameter on the CPU, whatever the mix of dtypes: from the C kernels (one read of each
parameter and its snapshot, nothing written), the exact norms within the stated bound;
without them (``PRECALIGN_FUSED_STATS=0``), bit for bit ``get_total_norm``'s over the three
sweeps it replaces (torch groups them by dtype)."""

from __future__ import annotations

import math

import pytest
import torch

from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.chunked_stats import SUM_ULPS
from pytest_precalign.steps.step_norms import grad_norm_and_zeros, param_and_update_norms


@pytest.fixture(params=["native", "torch"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "torch":
        monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    else:
        assert native_kernels.kernel_state() == "native", "this machine builds the C kernels"
    return str(request.param)


def _exact_norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(math.fsum(v * v for t in tensors for v in t.double().reshape(-1).tolist()))


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(300, 70, generator=g),
        torch.randn(1000, generator=g).bfloat16(),
        torch.randn(33, generator=g, dtype=torch.float64),
        torch.randn(5, 5, generator=g) * 1e3,
        torch.randn(64, generator=g).half(),
        torch.randn(1, generator=g),
    ]


def test_the_three_sweeps_values_with_mixed_dtypes(kernels: str) -> None:
    after = _params()
    before = [
        p + torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(p.dtype) * 1e-3 for p in after
    ]
    expected_param = torch.nn.utils.get_total_norm(after, 2.0)
    expected_update = torch.nn.utils.get_total_norm(torch._foreach_sub(before, after), 2.0)
    snapshot = [b.clone() for b in before]
    param, update = param_and_update_norms(after, snapshot)
    assert update is not None
    if kernels == "torch":
        assert param.item() == expected_param.item() and update.item() == expected_update.item() > 0
        assert all(torch.equal(s, b - a) for s, b, a in zip(snapshot, before, after, strict=True))
        return
    # half types' differences are taken in float32 (exact here), as the kernels take them
    deltas = [
        b.float() - a.float() if a.dtype in (torch.bfloat16, torch.float16) else b - a
        for b, a in zip(before, after, strict=True)
    ]
    bound = SUM_ULPS * torch.finfo(torch.float32).eps
    assert abs(param.item() - _exact_norm(after)) <= bound * _exact_norm(after)
    assert abs(update.item() - _exact_norm(deltas)) <= bound * _exact_norm(deltas)
    assert all(torch.equal(s, b) for s, b in zip(snapshot, before, strict=True))  # nothing written


def test_without_a_snapshot_the_parameter_norm_only(kernels: str) -> None:
    after = _params()
    param, update = param_and_update_norms(after, None)
    assert update is None
    if kernels == "torch":
        assert param.item() == torch.nn.utils.get_total_norm(after, 2.0).item()
    else:
        assert abs(param.item() - _exact_norm(after)) <= SUM_ULPS * torch.finfo(
            torch.float32
        ).eps * _exact_norm(after)


def test_grad_norm_and_zeros_bitwise_the_two_reads_in_one_host_sync(kernels: str) -> None:
    from pytest_precalign.recording.host_sync import host_syncs
    from pytest_precalign.steps.step_evidence import grad_norm, zero_count

    grads = _params()
    for g in grads:
        g.view(-1)[::3] = 0.0
    expected = (grad_norm(grads), zero_count(grads))
    before = host_syncs()
    got = grad_norm_and_zeros(grads)
    assert host_syncs() - before == 1
    assert got == expected and got[1] > 0
    assert grad_norm_and_zeros([]) == (0.0, 0)
