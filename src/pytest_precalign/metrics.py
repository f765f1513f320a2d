"""Pure metrics over a (baseline, candidate) tensor pair, registered by name.

Definitions follow msprobe/msit compare (seed 001): cosine, max/mean absolute error,
max relative error, Euclidean distance, and the share of elements whose relative error is
within 1/1000 and 5/1000. Computed in float64 over the elements finite on both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

Metric = Callable[[torch.Tensor, torch.Tensor], float]
_TINY = 1e-30  # relative error against an exact zero baseline is effectively infinite


def _diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (b - a).abs()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
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
    return float(torch.linalg.vector_norm(b - a))


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


def as_float64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="cpu", dtype=torch.float64)


def closeness(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> Closeness:
    """a = baseline (expected), b = candidate (actual); both float64, same shape."""
    shape = a.shape
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    # Non-finite values match only when equal (NaN == NaN here, like equal_nan=True).
    same_nonfinite = (~fa & ~fb) & ((a == b) | (torch.isnan(a) & torch.isnan(b)))
    nonfinite_mismatch = int(((fa != fb) | (~fa & ~fb & ~same_nonfinite)).sum())
    both = fa & fb
    diff = torch.where(both, (b - a).abs(), torch.zeros((), dtype=a.dtype))
    allowed = atol + rtol * a.abs()
    bad = (diff > allowed) & both
    mismatched = int(bad.sum()) + nonfinite_mismatch
    rel = torch.where(both, diff / a.abs().clamp_min(_TINY), torch.zeros((), dtype=a.dtype))
    if a.numel() == 0:
        return Closeness(0, 0, (), 0.0, 0.0, 0.0, (), 0.0, (), 0)
    # The worst element is the one using the largest share of its allowance.
    ratio = torch.where(both, diff / allowed.clamp_min(_TINY), torch.zeros((), dtype=a.dtype))
    worst = int(ratio.reshape(-1).argmax())
    gabs = int(diff.reshape(-1).argmax())
    grel = int(rel.reshape(-1).argmax())
    return Closeness(
        total=a.numel(),
        mismatched=mismatched,
        worst_index=_unravel(worst, shape),
        worst_abs=float(diff.reshape(-1)[worst]),
        worst_allowed=float(allowed.reshape(-1)[worst]),
        greatest_abs=float(diff.reshape(-1)[gabs]),
        greatest_abs_index=_unravel(gabs, shape),
        greatest_rel=float(rel.reshape(-1)[grel]),
        greatest_rel_index=_unravel(grel, shape),
        nonfinite_mismatch=nonfinite_mismatch,
    )


def finite_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements finite on both sides, flattened (metrics are computed over these)."""
    both = torch.isfinite(a) & torch.isfinite(b)
    if bool(both.all()):
        return a.reshape(-1), b.reshape(-1)
    return a[both], b[both]
