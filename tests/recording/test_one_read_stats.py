"""Statistics of a CPU tensor read once from memory -- by the C kernels (``native_kernels.py``)
and, where none is built, in pieces (``chunked_stats.py``, large tensors) -- against the
one-call reductions (``aminmax``, ``sum``, ``vector_norm``: the reference path): max, min and
the NaN/Inf counts equal bit for bit; sum and norm within the stated bound (``SUM_ULPS``
epsilon) of the exact values, where the reference's norm is not; the same values for equal
tensors whatever the thread count; without the C kernels, small, non-contiguous and 1-element
tensors keep the reference path, bit for bit."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator

import pytest
import torch

import pytest_precalign.recording.tensor_summary as summary
from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.chunked_stats import CHUNKED_NUMEL, SUM_ULPS
from pytest_precalign.recording.tensor_summary import stats_vector

N = CHUNKED_NUMEL + 12_345  # a partial last piece


def _reference(t: torch.Tensor) -> list[float]:
    """The one-call reductions' values for ``t`` (the C kernels and the chunked path off)."""
    before, env = summary.CHUNKED_NUMEL, os.environ.get("PRECALIGN_FUSED_STATS")
    summary.CHUNKED_NUMEL = 1 << 62
    os.environ["PRECALIGN_FUSED_STATS"] = "0"
    try:
        return list(stats_vector(t, counts="if_nonfinite").tolist())
    finally:
        summary.CHUNKED_NUMEL = before
        if env is None:
            del os.environ["PRECALIGN_FUSED_STATS"]
        else:
            os.environ["PRECALIGN_FUSED_STATS"] = env


@pytest.fixture(params=["native", "chunked"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The one-read path under test: the C kernels, or (turned off) the pieces."""
    if request.param == "native":
        assert native_kernels.kernel_state() == "native", "this machine builds the C kernels"
    else:
        monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    return str(request.param)


def _bits(values: list[float]) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def _exact(t: torch.Tensor) -> tuple[float, float, float]:
    """(sum, norm, sum of |x|), exactly rounded (math.fsum over float64 values)."""
    values = t.double().reshape(-1).tolist()
    return math.fsum(values), math.sqrt(math.fsum(v * v for v in values)), math.fsum(map(abs, values))


def _large() -> Iterator[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, generator=g) * 3 + 1
    yield "random", x
    yield "constant", torch.full((N,), 0.1)
    yield "zeros", torch.zeros(N)
    yield "denormal", torch.full((N,), 1e-40)
    yield "bfloat16", x.bfloat16()
    yield "float16", x.half()
    yield "float64", torch.randn(N, generator=g, dtype=torch.float64)
    yield "logits_shaped", torch.randn(2 * 64, 32000, generator=g)


@pytest.mark.parametrize(("name", "t"), list(_large()))
def test_max_min_exact_and_sum_norm_within_the_stated_bound_of_the_exact_values(
    name: str, t: torch.Tensor, path: str
) -> None:
    got, ref = stats_vector(t, counts="if_nonfinite").tolist(), _reference(t)
    assert _bits(got[:2]) == _bits(ref[:2]) and got[4:] == ref[4:] == [0.0, 0.0]
    total, norm, magnitude = _exact(t)
    eps = torch.finfo(torch.float64 if t.dtype == torch.float64 else torch.float32).eps
    assert abs(got[2] - total) <= SUM_ULPS * eps * magnitude
    # squares below the dtype's smallest subnormal vanish (the reference's too): an absolute term
    underflow = math.sqrt(
        t.numel() * torch.finfo(torch.float32 if eps > 1e-10 else torch.float64).smallest_normal * eps
    )
    assert abs(got[3] - norm) <= SUM_ULPS * eps * norm + underflow
    # the reference is never closer than the bound (its fp32 norm is far off on large tensors)
    assert abs(got[3] - norm) <= max(abs(ref[3] - norm), SUM_ULPS * eps * norm + underflow)


def test_the_reference_fp32_norm_is_outside_the_bound_that_the_pieces_meet(path: str) -> None:
    # Why the bits differ from the one-call path: its norm accumulates nearly serially.
    t = torch.full((N,), 0.1)
    _, norm, _ = _exact(t)
    eps = torch.finfo(torch.float32).eps
    assert abs(_reference(t)[3] - norm) > 100 * SUM_ULPS * eps * norm
    assert abs(stats_vector(t).tolist()[3] - norm) <= SUM_ULPS * eps * norm


def test_non_finite_values_give_the_same_counts_and_non_finite_statistics(path: str) -> None:
    t = torch.randn(N, generator=torch.Generator().manual_seed(1))
    t[[5, N - 3]] = float("nan")
    t[CHUNKED_NUMEL // 2] = float("inf")
    got, ref = stats_vector(t, counts="if_nonfinite").tolist(), _reference(t)
    assert got[4:] == ref[4:] == [2.0, 1.0]
    assert all(math.isnan(v) for v in got[:4]) == all(math.isnan(v) for v in ref[:4])
    only_inf = torch.zeros(N)
    only_inf[7] = float("-inf")
    got, ref = stats_vector(only_inf, counts="if_nonfinite").tolist(), _reference(only_inf)
    assert _bits(got[:2]) == _bits(ref[:2]) and got[4:] == ref[4:] == [0.0, 1.0]
    assert got[2] == ref[2] == float("-inf")


@pytest.mark.parametrize(
    "t",
    [
        torch.randn(1000, 3000, generator=torch.Generator().manual_seed(2)).t(),  # non-contiguous
        torch.randn(CHUNKED_NUMEL, generator=torch.Generator().manual_seed(3)),  # at the bound
        torch.tensor([2.5]),  # one element
        torch.tensor([1e-40]),  # a denormal
    ],
    ids=["non_contiguous", "at_the_bound", "one_element", "one_denormal"],
)
def test_without_the_c_kernels_small_and_non_contiguous_tensors_keep_the_reference_bits(
    t: torch.Tensor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    assert t.numel() <= CHUNKED_NUMEL or not t.is_contiguous()
    assert _bits(stats_vector(t, counts="if_nonfinite").tolist()) == _bits(_reference(t))


@pytest.mark.parametrize("numel", [N, 100_003, 2 * native_kernels.PART + 7])
def test_equal_tensors_equal_statistics_whatever_the_thread_count(numel: int, path: str) -> None:
    before = torch.get_num_threads()
    t = torch.randn(numel, generator=torch.Generator().manual_seed(4)) * 2 - 1
    try:
        torch.set_num_threads(2)
        on_two = stats_vector(t.clone()).tolist()
        torch.set_num_threads(1)
        on_one = stats_vector(t).tolist()
    finally:
        torch.set_num_threads(before)
    assert _bits(on_two) == _bits(on_one)


def _fused_cases() -> Iterator[tuple[str, torch.Tensor]]:
    yield from _large()
    g = torch.Generator().manual_seed(5)
    bad = torch.randn(1000, generator=g)
    bad[[1, 2]] = float("nan")
    bad[3] = float("inf")
    yield "non_finite", bad
    yield "non_contiguous", torch.randn(300, 500, generator=g).t()
    yield "one_element", torch.tensor([2.5])


def _check_fused(t: torch.Tensor, got: list[float]) -> None:
    ref = _reference(t.cpu())
    assert got[4:] == ref[4:]
    assert [v if v == v else "nan" for v in got[:2]] == [
        v if v == v else "nan" for v in ref[:2]
    ]  # NaN's sign may differ
    if not all(map(math.isfinite, ref[:4])):
        assert [math.isfinite(v) for v in got[:4]] == [math.isfinite(v) for v in ref[:4]]
        return
    total, norm, magnitude = _exact(t.cpu())
    eps = torch.finfo(torch.float64 if t.dtype == torch.float64 else torch.float32).eps
    underflow = math.sqrt(t.numel() * torch.finfo(torch.float32).smallest_normal * eps)
    assert abs(got[2] - total) <= SUM_ULPS * eps * magnitude
    assert abs(got[3] - norm) <= SUM_ULPS * eps * norm + underflow


@pytest.mark.parametrize(("name", "t"), list(_fused_cases()))
def test_the_fused_kernels_values_eager_on_the_cpu(name: str, t: torch.Tensor) -> None:
    # The function the device compiles, run eagerly: its values meet the same bounds.
    from pytest_precalign.recording.fused_stats import _six

    got = _six(t).tolist()
    assert len(got) == 6
    _check_fused(t, got)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize(("name", "t"), list(_fused_cases()))
def test_the_fused_path_on_a_device(name: str, t: torch.Tensor) -> None:
    from pytest_precalign.recording.fused_stats import fused_for

    device = t.cuda()
    assert fused_for(device)
    got = stats_vector(device, counts=True).tolist()
    assert _bits(got) == _bits(stats_vector(device.clone(), counts=True).tolist())  # equal -> equal
    _check_fused(t, got)
