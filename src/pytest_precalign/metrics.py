"""Pure metrics over a (baseline, candidate) tensor pair, registered by name.

Definitions follow msprobe/msit compare (seed 001): cosine, max/mean absolute error,
max relative error, Euclidean distance, and the share of elements whose relative error is
within 1/1000 and 5/1000, over the elements finite on both sides; in float32 (float64 when
a side is float64), with double accumulation for the similarity and distances.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Metric = Callable[[torch.Tensor, torch.Tensor], float]
_TINY = 1e-30  # relative error against an exact zero baseline is effectively infinite


def _diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (b - a).abs()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()  # a similarity near 1 needs double accumulation
    na, nb = torch.linalg.vector_norm(a), torch.linalg.vector_norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(torch.dot(a.reshape(-1), b.reshape(-1)) / (na * nb))


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(_diff(a, b).max()) if a.numel() else 0.0


def mean_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(_diff(a, b).mean()) if a.numel() else 0.0


def rel_err(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _diff(a, b) / a.abs().clamp_min(_TINY)


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(rel_err(a, b).max()) if a.numel() else 0.0


def euclidean(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(b - a, dtype=torch.float64))


def one_thousandth(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((rel_err(a, b) <= 1e-3).double().mean()) if a.numel() else 1.0


def five_thousandth(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((rel_err(a, b) <= 5e-3).double().mean()) if a.numel() else 1.0


METRICS: dict[str, Metric] = {
    "cosine": cosine,
    "max_abs": max_abs,
    "max_rel": max_rel,
    "mean_abs": mean_abs,
    "euclidean": euclidean,
    "one_thousandth": one_thousandth,
    "five_thousandth": five_thousandth,
}


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


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    out = []
    for dim in reversed(shape):
        out.append(flat_index % dim)
        flat_index //= dim
    return tuple(reversed(out))


def compute_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """float64 when either side is float64, else float32 (exact for bf16/fp16 values; the
    difference of two close fp32 values is exact in fp32)."""
    return torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32


def as_compute(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=dtype)


def closeness(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> Closeness:
    """a = baseline (expected), b = candidate (actual); same shape and floating dtype."""
    shape = a.shape
    if a.numel() == 0:
        return Closeness(0, 0, (), 0.0, 0.0, 0.0, (), 0.0, (), 0)
    nonfinite_mismatch = 0
    diff = (b - a).abs_()
    flat = diff.reshape(-1)
    gabs = int(flat.argmax())
    greatest = float(flat[gabs])  # NaN when either side has a NaN or both an equal infinity
    if math.isfinite(greatest) and greatest <= atol:
        # Every element is within atol (so within atol + rtol*|a|): the common aligned case,
        # settled in three passes over the data.
        allowed_there = atol + rtol * abs(float(a.reshape(-1)[gabs]))
        index = _unravel(gabs, shape)
        return Closeness(
            total=a.numel(),
            mismatched=0,
            worst_index=index,
            worst_abs=greatest,
            worst_allowed=allowed_there,
            greatest_abs=greatest,
            greatest_abs_index=index,
            greatest_rel=0.0,
            greatest_rel_index=(),
            nonfinite_mismatch=0,
        )
    if math.isfinite(greatest) or (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        both: torch.Tensor | None = None
    else:
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        # Non-finite values match only when equal (NaN == NaN here, like equal_nan=True).
        same_nonfinite = (~fa & ~fb) & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
        nonfinite_mismatch = int(((fa != fb) | (~fa & ~fb & ~same_nonfinite)).sum())
        both = fa & fb
        diff = torch.where(both, (b - a).abs(), torch.zeros((), dtype=a.dtype))
    allowed = a.abs().mul_(rtol).add_(atol)
    if both is not None:
        allowed = torch.where(both, allowed, torch.full((), float("inf"), dtype=a.dtype))
    # The worst element is the one using the largest share of its allowance.
    ratio = diff / allowed.clamp_min(_TINY)
    flat_ratio = ratio.reshape(-1)
    worst = int(flat_ratio.argmax())
    mismatched = nonfinite_mismatch
    if float(flat_ratio[worst]) > 1.0:
        mismatched += int((ratio > 1.0).sum())
    flat_diff = diff.reshape(-1)
    gabs = int(flat_diff.argmax())
    greatest_rel: float = 0.0
    grel_index: tuple[int, ...] = ()
    if mismatched:  # relative error details are only reported for failures
        rel = (diff / a.abs().clamp_min(_TINY)).reshape(-1)
        grel = int(rel.argmax())
        greatest_rel, grel_index = float(rel[grel]), _unravel(grel, shape)
    return Closeness(
        total=a.numel(),
        mismatched=mismatched,
        worst_index=_unravel(worst, shape),
        worst_abs=float(flat_diff[worst]),
        worst_allowed=float(allowed.reshape(-1)[worst]),
        greatest_abs=float(flat_diff[gabs]),
        greatest_abs_index=_unravel(gabs, shape),
        greatest_rel=greatest_rel,
        greatest_rel_index=grel_index,
        nonfinite_mismatch=nonfinite_mismatch,
    )


def finite_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements finite on both sides, flattened (metrics are computed over these)."""
    both = torch.isfinite(a) & torch.isfinite(b)
    if bool(both.all()):
        return a.reshape(-1), b.reshape(-1)
    return a[both], b[both]
