"""``stats_vector(t, counts="if_nonfinite")`` of a CPU tensor: the six float64 values of the
statistics with their NaN/Inf counts (zeros when finite), bit for bit the ones of the plain
path (the four statistics, then the counted ones only when they are not finite), read at once
from host memory rather than selected by torch through a mask of a dozen small operations."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_precalign.recording.tensor_summary import all_finite, stats_vector
from tests.helpers.stats_cases import stats_cases


def _reference(t: torch.Tensor) -> list[float]:
    values = stats_vector(t).tolist()
    return stats_vector(t, counts=True).tolist() if not all_finite(values) else [*values, 0.0, 0.0]


def _bits(values: list[float]) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]  # NaN equal to NaN, -0.0 not equal to 0.0


@pytest.mark.parametrize("name", list(stats_cases()))
def test_the_values_are_bitwise_the_plain_paths(name: str) -> None:
    t = stats_cases()[name]
    got = stats_vector(t, counts="if_nonfinite")
    assert got.dtype == torch.float64 and got.shape == (6,)
    assert _bits(got.tolist()) == _bits(_reference(t))


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_finite_cpu_tensor_costs_one_read_by_the_c_kernel_and_no_torch_reduction() -> None:
    t = torch.randn(512, generator=torch.Generator().manual_seed(1))
    ops = _Ops()
    with ops:
        got = stats_vector(t, counts="if_nonfinite")
    assert got.shape == (6,) and got[4:].tolist() == [0.0, 0.0]
    assert ops.seen == ["aten.lift_fresh.default"], ops.seen  # the six values' tensor; no reduction


def test_without_the_c_kernels_a_finite_cpu_tensor_costs_its_three_reductions_and_reads_of_their_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    t = torch.randn(512, generator=torch.Generator().manual_seed(1))
    ops = _Ops()
    with ops:
        stats_vector(t, counts="if_nonfinite")
    reductions = {"aten.aminmax.default", "aten.sum.default", "aten.linalg_vector_norm.default"}
    assert reductions <= set(ops.seen)
    # the reductions, one read of each value, the six-value vector: no masked selection, no
    # NaN/Inf passes over an empty selection (the masked path took 21 operations)
    assert len(ops.seen) <= 9, ops.seen
    assert not {"aten.isnan.default", "aten.index.Tensor"} & set(ops.seen)
