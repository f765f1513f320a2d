"""Pure metrics over a (baseline, candidate) tensor pair, registered by name.

Definitions follow msprobe/msit compare (seed 001): cosine, max/mean absolute error,
max relative error, Euclidean distance, and the share of elements whose relative error is
within 1/1000 and 5/1000, over the elements finite on both sides; in float32 (float64 when
a side is float64), with double accumulation for the similarity and distances.

Everything runs on numpy arrays (torch tensors are viewed as arrays, see ``arrays``), in
chunks of ``CHUNK`` elements: a chunk's temporaries stay in cache, so a pair costs little more
than reading it once, and memory stays flat however large the tensors are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..trace.arrays import as_numpy

Metric = Callable[[Any, Any], float]
_TINY = 1e-30  # relative error against an exact zero baseline is effectively infinite
# 128K elements. 32K kept a chunk of both sides and its temporaries in a core's L2 (faster on
# one thread), but at 32K the numpy operations are too short for two threads to overlap; since
# the scratch buffers are reused (fused_pass._buffers), 128K is as fast on one thread and lets
# two scale (benchmarks/compare_vs_msprobe.py, README "Benchmarks").
CHUNK = 1 << 17


def compute_dtype(a: Any, b: Any) -> type[np.floating[Any]]:
    """float64 when either side is float64, else float32 (exact for bf16/fp16 values; the
    difference of two close fp32 values is exact in fp32)."""
    wide = any(str(x.dtype) in ("float64", "torch.float64") for x in (a, b))
    return np.float64 if wide else np.float32


def as_compute(t: Any, dtype: type[np.floating[Any]]) -> np.ndarray:
    """The flat array of a tensor in the compute dtype (a view when it already is)."""
    return as_numpy(t).astype(dtype, copy=False).reshape(-1)


def _chunks(a: np.ndarray, b: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    for start in range(0, a.size, CHUNK):
        yield start, a[start : start + CHUNK], b[start : start + CHUNK]


# -- the named metrics -----------------------------------------------------------------------


@dataclass
class _Sums:
    """Running sums over the elements finite on both sides."""

    n: int = 0
    aa: float = 0.0
    bb: float = 0.0
    ab: float = 0.0
    dd: float = 0.0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    rel_max: float = 0.0
    within_1e3: int = 0
    within_5e3: int = 0
    total: int = 0  # every element, finite or not
    nonfinite_mismatch: int = 0  # NaN/Inf on one side only, or different ones on each side
    nonfinite_shared: int = 0  # the same NaN/Inf on both sides at the same place


def nonfinite_counts(ca: np.ndarray, cb: np.ndarray, ok_a: np.ndarray, ok_b: np.ndarray) -> tuple[int, int]:
    """``(mismatched, shared)``: elements non-finite on one side only or non-finite on both but
    not the same value; and elements with the same NaN/Inf on both sides. Shared ones are
    neither a match nor a mismatch here: the tolerance rule says (``equal_nan``, as
    torch.testing.assert_close, off by default) -- ``compare.pairs``."""
    neither = ~ok_a & ~ok_b
    same = neither & ((ca == cb) | (np.isnan(ca) & np.isnan(cb)))
    shared = int(np.count_nonzero(same))
    return int(np.count_nonzero((ok_a != ok_b) | neither)) - shared, shared


def _sums(a: Any, b: Any) -> _Sums:
    with np.errstate(all="ignore"):  # inf - inf and overflow are findings, not warnings
        return _sums_quiet(a, b)


def _sums_quiet(a: Any, b: Any) -> _Sums:
    xa, xb = as_numpy(a), as_numpy(b)
    dtype = compute_dtype(xa, xb)
    fa, fb = as_compute(xa, dtype), as_compute(xb, dtype)
    s = _Sums()
    for _, ca, cb in _chunks(fa, fb):
        s.total += ca.size
        ok_a, ok_b = np.isfinite(ca), np.isfinite(cb)
        both = ok_a & ok_b
        if not both.all():
            mismatch, shared = nonfinite_counts(ca, cb, ok_a, ok_b)
            s.nonfinite_mismatch += mismatch
            s.nonfinite_shared += shared
            ca, cb = ca[both], cb[both]
        if not ca.size:
            continue
        d = np.abs(cb - ca)
        rel = d / np.maximum(np.abs(ca), _TINY)
        a64, b64, d64 = (x.astype(np.float64) for x in (ca, cb, d))
        _accumulate(s, a64, b64, d64, d, rel)
    return s


def _accumulate(
    s: _Sums, a64: np.ndarray, b64: np.ndarray, d64: np.ndarray, d: np.ndarray, rel: np.ndarray
) -> None:
    """Add one chunk (its float64 copies, |b - a| and the relative difference) to the sums."""
    s.n += a64.size
    s.aa += float(a64 @ a64)
    s.bb += float(b64 @ b64)
    s.ab += float(a64 @ b64)
    s.dd += float(d64 @ d64)
    s.abs_sum += float(d64.sum())
    s.abs_max = max(s.abs_max, float(d.max()))
    s.rel_max = max(s.rel_max, float(rel.max()))
    s.within_1e3 += int(np.count_nonzero(rel <= 1e-3))
    s.within_5e3 += int(np.count_nonzero(rel <= 5e-3))


def _cosine(s: _Sums) -> float:
    na, nb = math.sqrt(s.aa), math.sqrt(s.bb)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return s.ab / (na * nb)


_FROM_SUMS: dict[str, Callable[[_Sums], float]] = {
    "cosine": _cosine,
    "max_abs": lambda s: s.abs_max,
    "max_rel": lambda s: s.rel_max,
    "mean_abs": lambda s: s.abs_sum / s.n if s.n else 0.0,
    "euclidean": lambda s: math.sqrt(s.dd),
    "one_thousandth": lambda s: s.within_1e3 / s.n if s.n else 1.0,
    "five_thousandth": lambda s: s.within_5e3 / s.n if s.n else 1.0,
}


def metric_values(a: Any, b: Any, names: tuple[str, ...]) -> dict[str, float]:
    """Several named metrics of one pair in a single pass."""
    s = _sums(a, b)
    return {name: _FROM_SUMS[name](s) for name in names}


@dataclass(frozen=True)
class MetricSummary:
    """Named metrics of a pair, with what they were computed over."""

    values: dict[str, float]  # NaN for each metric when no element is finite on both sides
    total: int  # elements
    finite: int  # elements finite on both sides: what the metrics are computed over
    nonfinite_mismatch: int  # NaN/Inf on one side only, or different ones on each side
    nonfinite_shared: int = 0  # the same NaN/Inf on both sides at the same place

    @property
    def comparable(self) -> bool:
        """Metrics over zero finite elements say nothing: not comparable (an empty tensor is)."""
        return self.finite > 0 or self.total == 0


def metric_summary(a: Any, b: Any, names: tuple[str, ...]) -> MetricSummary:
    """``metric_values`` and the NaN/Inf positions that differ, in a single pass."""
    s = _sums(a, b)
    values = {name: _FROM_SUMS[name](s) if s.n or not s.total else math.nan for name in names}
    return MetricSummary(values, s.total, s.n, s.nonfinite_mismatch, s.nonfinite_shared)


def _named(name: str) -> Metric:
    def metric(a: Any, b: Any) -> float:
        return _FROM_SUMS[name](_sums(a, b))

    metric.__name__ = name
    return metric


cosine = _named("cosine")
max_abs = _named("max_abs")
max_rel = _named("max_rel")
mean_abs = _named("mean_abs")
euclidean = _named("euclidean")
one_thousandth = _named("one_thousandth")
five_thousandth = _named("five_thousandth")

METRICS: dict[str, Metric] = {name: _named(name) for name in _FROM_SUMS}


# -- allclose --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Closeness:
    """torch.testing.assert_close's view of a pair: which elements exceed atol + rtol*|baseline|."""

    total: int
    mismatched: int
    worst_index: tuple[int, ...]  # the element using the largest share of its allowance
    worst_abs: float
    worst_allowed: float
    greatest_abs: float
    greatest_abs_index: tuple[int, ...]
    greatest_rel: float
    greatest_rel_index: tuple[int, ...]
    nonfinite_mismatch: int
    nonfinite_shared: int = 0  # the same NaN/Inf on both sides at the same place (not in mismatched)


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(out))


@dataclass
class _Best:
    """A running argmax: the first index holding the largest value."""

    value: float = -math.inf
    index: int = -1

    def offer(self, values: np.ndarray, start: int) -> None:
        k = int(values.argmax())
        v = float(values[k])
        if v > self.value or self.index < 0:
            self.value, self.index = v, start + k


def closeness(a: Any, b: Any, atol: float, rtol: float, shape: Sequence[int] | None = None) -> Closeness:
    """a = baseline (expected), b = candidate (actual); same shape and floating dtype.

    ``shape``: the tensors' shape when ``a`` and ``b`` are their flat views, so that indices
    name the element as torch.testing does, ``(1, 22, 37)`` rather than ``(3493,)``."""
    with np.errstate(all="ignore"):  # inf - inf and overflow are findings, not warnings
        return _closeness(a, b, atol, rtol, shape)


def _closeness(a: Any, b: Any, atol: float, rtol: float, given: Sequence[int] | None) -> Closeness:
    xa, xb = as_numpy(a), as_numpy(b)
    shape = tuple(int(d) for d in xa.shape)
    if given is not None and math.prod(given) == xa.size:
        shape = tuple(int(d) for d in given)
    if xa.size == 0:
        return Closeness(0, 0, (), 0.0, 0.0, 0.0, (), 0.0, (), 0)
    dtype = compute_dtype(xa, xb)
    fa, fb = as_compute(xa, dtype), as_compute(xb, dtype)
    # Pass 1, the common aligned case: every |b - a| is finite and within atol, so within
    # atol + rtol*|a|. The first chunk that is not sends us to the full pass.
    greatest = _Best()
    full = False
    buffer = np.empty(min(CHUNK, fa.size), dtype=fa.dtype)
    for start, ca, cb in _chunks(fa, fb):
        d = np.subtract(cb, ca, out=buffer[: ca.size])
        np.abs(d, out=d)
        k = int(d.argmax())
        v = float(d[k])  # NaN when either side has a NaN or both an equal infinity
        if not (math.isfinite(v) and v <= atol):
            full = True
            break
        if v > greatest.value:
            greatest.value, greatest.index = v, start + k
    if not full:
        index = _unravel(greatest.index, shape)
        allowed_there = atol + rtol * abs(float(fa[greatest.index]))
        return Closeness(xa.size, 0, index, greatest.value, allowed_there, greatest.value, index, 0.0, (), 0)
    return _closeness_full(fa, fb, atol, rtol, shape)


def _closeness_full(
    fa: np.ndarray, fb: np.ndarray, atol: float, rtol: float, shape: tuple[int, ...]
) -> Closeness:
    worst, greatest, greatest_rel = _Best(), _Best(), _Best()
    worst_abs = worst_allowed = 0.0
    mismatched = nonfinite_mismatch = nonfinite_shared = 0
    inf = np.array(math.inf, dtype=fa.dtype)
    for start, ca, cb in _chunks(fa, fb):
        d = np.subtract(cb, ca)
        np.abs(d, out=d)
        absa = np.abs(ca)
        allowed = absa * fa.dtype.type(rtol)
        allowed += fa.dtype.type(atol)
        if not math.isfinite(float(d.max())):
            fa_ok, fb_ok = np.isfinite(ca), np.isfinite(cb)
            if not (fa_ok.all() and fb_ok.all()):
                both = fa_ok & fb_ok
                # Non-finite values differ unless equal; equal ones are counted apart (shared).
                mismatch, shared = nonfinite_counts(ca, cb, fa_ok, fb_ok)
                nonfinite_mismatch += mismatch
                nonfinite_shared += shared
                d = np.where(both, d, 0)
                allowed = np.where(both, allowed, inf)
        # The worst element is the one using the largest share of its allowance.
        ratio = np.maximum(allowed, _TINY)
        np.divide(d, ratio, out=ratio)
        before = worst.index
        worst.offer(ratio, start)
        if worst.index != before:
            worst_abs, worst_allowed = float(d[worst.index - start]), float(allowed[worst.index - start])
        mismatched += int(np.count_nonzero(ratio > 1.0))
        greatest.offer(d, start)
        np.maximum(absa, _TINY, out=absa)
        np.divide(d, absa, out=absa)
        greatest_rel.offer(absa, start)
    mismatched += nonfinite_mismatch
    rel, rel_index = (greatest_rel.value, _unravel(greatest_rel.index, shape)) if mismatched else (0.0, ())
    return Closeness(
        total=fa.size,
        mismatched=mismatched,
        worst_index=_unravel(worst.index, shape),
        worst_abs=worst_abs,
        worst_allowed=worst_allowed,
        greatest_abs=greatest.value,
        greatest_abs_index=_unravel(greatest.index, shape),
        greatest_rel=rel,
        greatest_rel_index=rel_index,
        nonfinite_mismatch=nonfinite_mismatch,
        nonfinite_shared=nonfinite_shared,
    )
