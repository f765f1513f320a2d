"""Everything a tensor pair's verdict needs, in one pass over both tensors.

``measure_pair`` reads each chunk of the two tensors once (``CHUNK`` elements: the chunk and
its temporaries stay in the core's cache, so memory is read once and every numpy operation
runs on cached data) and computes in that pass both the allclose view (``metrics.Closeness``)
and the named metric bounds (``metrics.MetricSummary``: the float64 sums for cosine and the
norms, the counts for the per-mille ratios, the NaN/Inf that differ). Before, these were two
passes (``metrics.closeness`` then ``metrics.metric_summary``).

The aligned case (every ``|b - a|`` finite and within ``atol``) costs a subtraction, an
absolute value and an argmax per chunk, plus the sums when bounds were asked for. The first
chunk that is not aligned sends the pair to the full pass, from the start, as
``metrics.closeness`` does: a second pass only for failing pairs. Both passes reuse
preallocated chunk buffers (no allocation per chunk) and reach bit-identical results to
``metrics.closeness`` and ``metrics.metric_summary`` (same chunking, same operations in the
same order: ``tests/compare/test_fused_pass.py``).

A bfloat16 side may be given as its raw ``uint16`` bit patterns (``widen``): it is then
widened to float32 a chunk at a time, with no widened copy of the whole tensor: the compare
asks the trace readers for raw bits (``Trace.raw_array``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import metrics
from .metrics import CHUNK, Closeness, MetricSummary

_TINY = metrics._TINY


@dataclass
class _Buffers:
    """Scratch arrays of one chunk, reused for every chunk of a pair and for every pair the
    thread compares (``_buffers``)."""

    d: np.ndarray
    absa: np.ndarray
    allowed: np.ndarray
    ratio: np.ndarray
    flags: np.ndarray
    wa: np.ndarray | None  # widened bf16 chunks (None: no side is bf16)
    wb: np.ndarray | None
    wide64: np.ndarray | None  # the sums' float64 copies of a, b and d (None: no sums)
    tiny: np.ndarray  # _TINY in every element: np.maximum against an array is ~3x faster than
    # against a scalar (~18 us against ~50 us for 128K float32 here: the scalar case has no
    # vectorised loop), the same values

    @classmethod
    def make(cls, dtype: np.dtype[Any], widen: tuple[bool, bool], sums: bool) -> _Buffers:
        n = CHUNK

        def wide() -> np.ndarray:
            return np.empty(n, dtype=np.float32)

        return cls(
            np.empty(n, dtype),
            np.empty(n, dtype),
            np.empty(n, dtype),
            np.empty(n, dtype),
            np.empty(n, dtype=bool),
            wide() if widen[0] else None,
            wide() if widen[1] else None,
            np.empty((3, n), dtype=np.float64) if sums else None,
            np.full(n, _TINY, dtype),
        )


_local = threading.local()


def _buffers(dtype: np.dtype[Any], widen: tuple[bool, bool], sums: bool) -> _Buffers:
    """This thread's buffers for pairs of this kind. Fresh ones per pair cost more than the
    pass over an aligned pair of small tensors: each 128 KB array is its own mapping, whose
    pages fault in when first written and are unmapped when freed (about 30,000 page faults
    in the 1 GB benchmark's compare; with two compare threads, each unmapping also
    interrupts the other core)."""
    cache: dict[tuple[str, tuple[bool, bool], bool], _Buffers] | None = getattr(_local, "buffers", None)
    if cache is None:
        cache = _local.buffers = {}
    key = (dtype.str, widen, sums)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _Buffers.make(dtype, widen, sums)
    return found


def _chunk(x: np.ndarray, start: int, stop: int, wide: np.ndarray | None, dtype: Any) -> np.ndarray:
    """Elements [start, stop) of flat ``x`` in the compute dtype (bf16 widened into ``wide``)."""
    part = x[start:stop]
    if wide is not None:
        out = wide[: part.size].view(np.uint32)
        np.left_shift(part, 16, out=out, dtype=np.uint32)
        return out.view(np.float32)
    if part.dtype != dtype:
        return part.astype(dtype)
    return part


@dataclass(frozen=True)
class PairMeasure:
    """What ``measure_pair`` found: the allclose view (None without ``atol``) and the named
    metrics (None when none were asked for and allclose was computed)."""

    closeness: Closeness | None
    summary: MetricSummary | None


def measure_pair(
    a: np.ndarray,
    b: np.ndarray,
    atol: float,
    rtol: float,
    names: tuple[str, ...],
    shape: Sequence[int],
    dtype: type[np.floating[Any]],
    widen: tuple[bool, bool] = (False, False),
) -> PairMeasure:
    """a = baseline, b = candidate: flat arrays of the same size, in ``dtype`` (float32 or
    float64) unless ``widen`` says a side is raw bfloat16 bits (uint16), widened per chunk.

    ``atol == inf``: no allclose view, only the metrics (and then always the metrics, for the
    NaN/Inf that differ). ``shape``: the tensors' shape, for the indices."""
    with np.errstate(all="ignore"):  # inf - inf and overflow are findings, not warnings
        return _measure(a, b, atol, rtol, names, tuple(int(d) for d in shape), np.dtype(dtype), widen)


def _measure(
    a: np.ndarray,
    b: np.ndarray,
    atol: float,
    rtol: float,
    names: tuple[str, ...],
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    widen: tuple[bool, bool],
) -> PairMeasure:
    allclose = atol != math.inf
    want_sums = bool(names) or not allclose
    if math.prod(shape) != a.size:
        shape = (a.size,)
    buf = _buffers(dtype, widen, want_sums)
    sums = metrics._Sums() if want_sums else None
    close: Closeness | None = None
    if allclose:
        if a.size == 0:
            close = Closeness(0, 0, (), 0.0, 0.0, 0.0, (), 0.0, (), 0)
        else:
            close = _aligned(a, b, atol, rtol, shape, dtype, buf, sums)
            if close is None:  # not aligned: the full pass, from the start
                sums = metrics._Sums() if want_sums else None
                close = _full(a, b, atol, rtol, shape, dtype, buf, sums)
    elif sums is not None:
        for start in range(0, a.size, CHUNK):
            stop = min(a.size, start + CHUNK)
            ca, cb = _chunk(a, start, stop, buf.wa, dtype), _chunk(b, start, stop, buf.wb, dtype)
            _add_sums(sums, ca, cb, buf, None)
    summary = None
    if sums is not None:
        values = {n: metrics._FROM_SUMS[n](sums) if sums.n or not sums.total else math.nan for n in names}
        summary = MetricSummary(values, sums.total, sums.n, sums.nonfinite_mismatch, sums.nonfinite_shared)
    return PairMeasure(close, summary)


def _aligned(
    a: np.ndarray,
    b: np.ndarray,
    atol: float,
    rtol: float,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    buf: _Buffers,
    sums: metrics._Sums | None,
) -> Closeness | None:
    """The aligned case's pass (``metrics._closeness``'s pass 1, the sums alongside); None at
    the first chunk that is not aligned."""
    best_v, best_i = -math.inf, -1
    for start in range(0, a.size, CHUNK):
        stop = min(a.size, start + CHUNK)
        ca, cb = _chunk(a, start, stop, buf.wa, dtype), _chunk(b, start, stop, buf.wb, dtype)
        d = np.subtract(cb, ca, out=buf.d[: ca.size])
        np.abs(d, out=d)
        k = int(d.argmax())
        v = float(d[k])  # NaN when either side has a NaN or both an equal infinity
        if not (math.isfinite(v) and v <= atol):
            return None
        if v > best_v:
            best_v, best_i = v, start + k
        if sums is not None:
            _add_sums(sums, ca, cb, buf, d)  # d finite: every element is finite on both sides
    index = metrics._unravel(best_i, shape)
    base = _chunk(a, best_i, best_i + 1, None if buf.wa is None else np.empty(1, np.float32), dtype)
    allowed_there = atol + rtol * abs(float(base[0]))
    return Closeness(a.size, 0, index, best_v, allowed_there, best_v, index, 0.0, (), 0)


def _full(
    a: np.ndarray,
    b: np.ndarray,
    atol: float,
    rtol: float,
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    buf: _Buffers,
    sums: metrics._Sums | None,
) -> Closeness:
    """``metrics._closeness_full`` with reused buffers, the sums alongside."""
    worst, greatest, greatest_rel = metrics._Best(), metrics._Best(), metrics._Best()
    worst_abs = worst_allowed = 0.0
    mismatched = nonfinite_mismatch = nonfinite_shared = 0
    inf, rtol_t, atol_t = np.array(math.inf, dtype=dtype), dtype.type(rtol), dtype.type(atol)
    floor_needed = not (atol_t >= dtype.type(_TINY) and rtol_t >= 0)  # see _ratio
    for start in range(0, a.size, CHUNK):
        stop = min(a.size, start + CHUNK)
        n = stop - start
        ca, cb = _chunk(a, start, stop, buf.wa, dtype), _chunk(b, start, stop, buf.wb, dtype)
        d = np.subtract(cb, ca, out=buf.d[:n])
        np.abs(d, out=d)
        k = int(d.argmax())
        finite = math.isfinite(float(d[k]))  # as d.max(): argmax stops at the first NaN
        if sums is not None:
            _add_sums(sums, ca, cb, buf, d if finite else None)
        absa = np.abs(ca, out=buf.absa[:n])
        allowed = np.multiply(absa, rtol_t, out=buf.allowed[:n])
        allowed += atol_t
        if not finite:
            d, allowed, count, shared = _mask_nonfinite(ca, cb, d, allowed, inf)
            nonfinite_mismatch += count
            nonfinite_shared += shared
        ratio = _ratio(d, allowed, buf.ratio[:n], buf.tiny[:n] if floor_needed or not finite else None)
        kw = int(ratio.argmax())
        if _offer(worst, ratio, start, kw):
            worst_abs, worst_allowed = float(d[kw]), float(allowed[kw])
        if not float(ratio[kw]) <= 1.0:  # else no element of the chunk is past its allowance
            mismatched += int(np.count_nonzero(np.greater(ratio, 1.0, out=buf.flags[:n])))
        _offer(greatest, d, start, k if finite else None)  # finite: d unchanged, its argmax is k
        np.maximum(absa, buf.tiny[:n], out=absa)
        np.divide(d, absa, out=absa)
        greatest_rel.offer(absa, start)
    mismatched += nonfinite_mismatch
    rel, rel_index = (
        (greatest_rel.value, metrics._unravel(greatest_rel.index, shape)) if mismatched else (0.0, ())
    )
    return Closeness(
        total=a.size,
        mismatched=mismatched,
        worst_index=metrics._unravel(worst.index, shape),
        worst_abs=worst_abs,
        worst_allowed=worst_allowed,
        greatest_abs=greatest.value,
        greatest_abs_index=metrics._unravel(greatest.index, shape),
        greatest_rel=rel,
        greatest_rel_index=rel_index,
        nonfinite_mismatch=nonfinite_mismatch,
        nonfinite_shared=nonfinite_shared,
    )


def _ratio(d: np.ndarray, allowed: np.ndarray, out: np.ndarray, tiny: np.ndarray | None) -> np.ndarray:
    """``d / max(allowed, _TINY)`` into ``out`` (``tiny``: ``_TINY`` in each element). With atol
    >= _TINY and rtol >= 0 every finite chunk's allowance is >= _TINY already: the floor
    changes nothing (``tiny`` None)."""
    if tiny is not None:
        np.maximum(allowed, tiny, out=out)
        allowed = out
    np.divide(d, allowed, out=out)
    return out


def _offer(best: metrics._Best, values: np.ndarray, start: int, k: int | None) -> bool:
    """``best.offer(values, start)``, without a second argmax when it is known (``k``);
    True when ``best`` moved to this chunk."""
    if k is None:
        before = best.index
        best.offer(values, start)
        return best.index != before
    value = float(values[k])
    if value > best.value or best.index < 0:
        best.value, best.index = value, start + k
        return True
    return False


def _mask_nonfinite(
    ca: np.ndarray, cb: np.ndarray, d: np.ndarray, allowed: np.ndarray, inf: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Elements not finite on both sides take no part in the allclose view (difference 0,
    allowance inf); they are counted: differing, or the same on both sides (shared)."""
    fa_ok, fb_ok = np.isfinite(ca), np.isfinite(cb)
    if fa_ok.all() and fb_ok.all():
        return d, allowed, 0, 0
    both = fa_ok & fb_ok
    count, shared = metrics.nonfinite_counts(ca, cb, fa_ok, fb_ok)
    return np.where(both, d, 0), np.where(both, allowed, inf), count, shared


def _add_sums(s: metrics._Sums, ca: np.ndarray, cb: np.ndarray, buf: _Buffers, d: np.ndarray | None) -> None:
    """``metrics._sums_quiet``'s body for one chunk. ``d``: the chunk's ``|b - a|`` when it is
    known finite everywhere (then so is every element of both sides)."""
    s.total += ca.size
    if d is None:
        ok_a, ok_b = np.isfinite(ca), np.isfinite(cb)
        both = ok_a & ok_b
        if not both.all():
            mismatch, shared = metrics.nonfinite_counts(ca, cb, ok_a, ok_b)
            s.nonfinite_mismatch += mismatch
            s.nonfinite_shared += shared
            ca, cb = ca[both], cb[both]
        if not ca.size:
            return
        d = np.abs(cb - ca)
    rel = np.abs(ca, out=buf.absa[: ca.size])
    np.maximum(rel, buf.tiny[: ca.size], out=rel)
    np.divide(d, rel, out=rel)
    a64, b64, d64 = _float64(buf, (ca, cb, d))
    metrics._accumulate(s, a64, b64, d64, d, rel)


def _float64(buf: _Buffers, parts: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """float64 copies of the chunk's arrays, in the reused buffers (a fresh array per chunk
    costs its page faults every time)."""
    if buf.wide64 is None:
        return tuple(x.astype(np.float64) for x in parts)
    out = []
    for row, x in zip(buf.wide64, parts, strict=True):
        np.copyto(row[: x.size], x)
        out.append(row[: x.size])
    return tuple(out)
