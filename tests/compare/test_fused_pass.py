"""The fused pass gives what the separate passes and the plain numpy formulas give.

``fused_pass.measure_pair`` computes the allclose view and the bounds' metrics of a pair in one
pass; ``metrics.closeness`` and ``metrics.metric_summary`` are the separate passes it replaces
(bit-identical results expected), and the formulas below are the definitions written out on
whole arrays (exact for maxima, counts and indices; float64 sums to 1e-12)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pytest_precalign.compare import fused_pass, metrics
from pytest_precalign.compare.metrics import CHUNK
from pytest_precalign.trace.tensor_files import bf16_to_float32

NAMES = ("cosine", "max_abs", "max_rel", "mean_abs", "euclidean", "one_thousandth", "five_thousandth")
SIZES = (0, 1, 7, CHUNK - 1, CHUNK, 2 * CHUNK + 13)


def _pair(size: int, dtype: str, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(size).astype(np.float32)
    b = a + (noise * rng.standard_normal(size)).astype(np.float32)
    if dtype == "bfloat16":  # bf16 values: float32 with the low 16 bits cleared
        a, b = (bf16_to_float32((x.view(np.uint32) >> 16).astype(np.uint16)) for x in (a, b))
    return a.astype(dtype if dtype != "bfloat16" else np.float32), b.astype(
        dtype if dtype != "bfloat16" else np.float32
    )


def _plant(a: np.ndarray, b: np.ndarray, seed: int) -> None:
    """NaN/Inf on one side, on both (same and different), at random places."""
    if a.size < 8:
        return
    rng = np.random.default_rng(seed)
    at = rng.choice(a.size, 6, replace=False)
    a[at[0]] = np.nan
    b[at[1]] = np.inf
    a[at[2]], b[at[2]] = np.nan, np.nan
    a[at[3]], b[at[3]] = np.inf, np.inf
    a[at[4]], b[at[4]] = np.inf, -np.inf
    a[at[5]] = -np.inf


def _naive(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """The metrics' definitions on whole arrays, over the elements finite on both sides."""
    dtype = np.float64 if np.float64 in (a.dtype, b.dtype) else np.float32
    a, b = a.astype(dtype), b.astype(dtype)
    both = np.isfinite(a) & np.isfinite(b)
    a, b = a[both], b[both]
    if not a.size:
        return {}
    d = np.abs(b - a)
    rel = d / np.maximum(np.abs(a), dtype(1e-30))
    a64, b64, d64 = a.astype(np.float64), b.astype(np.float64), d.astype(np.float64)
    na, nb = math.sqrt(a64 @ a64), math.sqrt(b64 @ b64)
    cos = 1.0 if na == nb == 0 else (0.0 if na == 0 or nb == 0 else float(a64 @ b64) / (na * nb))
    return {
        "cosine": cos,
        "max_abs": float(d.max()),
        "max_rel": float(rel.max()),
        "mean_abs": float(d64.mean()),
        "euclidean": math.sqrt(float(d64 @ d64)),
        "one_thousandth": float(np.count_nonzero(rel <= 1e-3)) / a.size,
        "five_thousandth": float(np.count_nonzero(rel <= 5e-3)) / a.size,
    }


def _naive_mismatch(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> int:
    """Elements outside atol + rtol*|a| (finite on both), plus the NaN/Inf that differ."""
    ok_a, ok_b = np.isfinite(a), np.isfinite(b)
    both = ok_a & ok_b
    with np.errstate(all="ignore"):
        far = np.abs(b - a) > atol + rtol * np.abs(a)
    neither = ~ok_a & ~ok_b
    same = neither & ((a == b) | (np.isnan(a) & np.isnan(b)))
    return int(np.count_nonzero(both & far)) + int(np.count_nonzero((ok_a != ok_b) | (neither & ~same)))


def _measure(a: np.ndarray, b: np.ndarray, atol: float, rtol: float, names: tuple[str, ...]) -> Any:
    dtype = metrics.compute_dtype(a, b)
    fa, fb = metrics.as_compute(a, dtype), metrics.as_compute(b, dtype)
    return fused_pass.measure_pair(fa, fb, atol, rtol, names, a.shape, dtype)


def _same(x: float, y: float) -> bool:
    return (math.isnan(x) and math.isnan(y)) or x == y


CASES = [
    (size, dtype, planted, noise)
    for size in SIZES
    for dtype in ("float32", "float16", "bfloat16", "float64")
    for planted in (False, True)
    for noise in (0.0, 1e-7, 1e-2)
]


@pytest.mark.parametrize(("size", "dtype", "planted", "noise"), CASES)
def test_fused_pass_matches_the_separate_passes_and_the_formulas(
    size: int, dtype: str, planted: bool, noise: float
) -> None:
    a, b = _pair(size, dtype, seed=size + 7, noise=noise)
    if planted:
        _plant(a, b, seed=size)
    atol, rtol = 1e-5, 1.3e-6
    found = _measure(a, b, atol, rtol, NAMES)
    # The separate passes, bit for bit.
    assert repr(found.closeness) == repr(metrics.closeness(a, b, atol, rtol))  # repr: NaN == NaN
    old = metrics.metric_summary(a, b, NAMES)
    assert found.summary is not None
    assert (found.summary.total, found.summary.finite) == (old.total, old.finite)
    assert found.summary.nonfinite_mismatch == old.nonfinite_mismatch
    assert all(_same(found.summary.values[n], old.values[n]) for n in NAMES), (
        found.summary.values,
        old.values,
    )
    # The definitions.
    assert found.closeness is not None
    assert found.closeness.mismatched == _naive_mismatch(a, b, atol, rtol)
    expected = _naive(a, b)
    if not expected:
        assert all(math.isnan(v) for v in found.summary.values.values()) or size == 0
        return
    for name in ("max_abs", "max_rel", "one_thousandth", "five_thousandth"):
        assert found.summary.values[name] == expected[name], name
    for name in ("cosine", "mean_abs", "euclidean"):
        assert found.summary.values[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-300), name


@pytest.mark.parametrize("noise", [0.0, 1e-6, 1e-2])
def test_without_atol_only_the_metrics_and_the_nonfinite(noise: float) -> None:
    a, b = _pair(CHUNK + 5, "float32", seed=3, noise=noise)
    _plant(a, b, seed=4)
    found = _measure(a, b, math.inf, 0.0, ("cosine",))
    assert found.closeness is None
    assert found.summary is not None
    assert found.summary.nonfinite_mismatch == metrics.metric_summary(a, b, ()).nonfinite_mismatch > 0
    assert found.summary.values["cosine"] == metrics.metric_summary(a, b, ("cosine",)).values["cosine"]


def test_zero_dimensional_pair_keeps_its_empty_index() -> None:
    a, b = np.array(1.0, np.float32), np.array(1.5, np.float32)
    found = _measure(a, b, 1e-5, 0.0, ("max_abs",))
    assert found.closeness == metrics.closeness(a, b, 1e-5, 0.0)
    assert (
        found.closeness is not None and found.closeness.worst_index == () and found.closeness.mismatched == 1
    )
    assert found.summary is not None and found.summary.values["max_abs"] == 0.5


def test_aligned_pair_with_rtol_headroom_goes_to_the_full_pass_late() -> None:
    """A pair aligned within atol except in its last chunk, where rtol lets it pass: the
    worst element can be in the first chunks, which the full pass reads again."""
    a, b = _pair(3 * CHUNK, "float32", seed=5, noise=1e-7)
    a[-1], b[-1] = 1000.0, 1000.0 + 1e-3  # beyond atol 1e-5, within rtol 1e-5 * 1000
    found = _measure(a, b, 1e-5, 1e-5, ())
    assert found.closeness == metrics.closeness(a, b, 1e-5, 1e-5)
    assert found.closeness is not None and found.closeness.mismatched == 0
    assert found.summary is None


@pytest.mark.parametrize("noise", [0.0, 1e-2])
def test_raw_bfloat16_widened_per_chunk_matches_the_widened_arrays(noise: float) -> None:
    """bf16 given as its raw bits (uint16) is widened a chunk at a time, to the same results as
    arrays widened up front."""
    a, b = _pair(2 * CHUNK + 3, "bfloat16", seed=9, noise=noise)
    _plant(a, b, seed=10)
    raw_a, raw_b = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (a, b))
    whole = _measure(a, b, 1e-5, 1.3e-6, NAMES)
    chunked = fused_pass.measure_pair(
        raw_a, raw_b, 1e-5, 1.3e-6, NAMES, a.shape, np.float32, widen=(True, True)
    )
    assert repr(chunked) == repr(whole)
    mixed = fused_pass.measure_pair(raw_a, b, 1e-5, 1.3e-6, NAMES, a.shape, np.float32, widen=(True, False))
    assert repr(mixed) == repr(whole)


@pytest.mark.parametrize(("atol", "rtol"), [(0.0, 1e-3), (0.0, 0.0), (1e-31, 0.0), (1e-30, 0.0), (1e-5, 0.0)])
@pytest.mark.parametrize("planted", [False, True])
def test_the_allowance_floor_only_where_it_applies(atol: float, rtol: float, planted: bool) -> None:
    """The full pass skips the floor max(allowed, _TINY) when atol >= _TINY: the same result as
    metrics.closeness, also with exact zeros in the baseline and atol below or at the floor."""
    a, b = _pair(100_000, "float32", seed=5, noise=1e-2)
    a[::7] = 0.0
    b[::14] = 0.0
    if planted:
        _plant(a, b, seed=5)
    found = _measure(a, b, atol, rtol, ())
    assert repr(found.closeness) == repr(metrics.closeness(a, b, atol, rtol))
    assert found.closeness is not None and found.closeness.mismatched == _naive_mismatch(a, b, atol, rtol)
