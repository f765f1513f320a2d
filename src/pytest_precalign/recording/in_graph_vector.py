"""The statistics vector of one tensor in pure torch ops dynamo traces into a compiled graph
(``compiled_stats.py`` takes the forward's, ``compiled_grads.py`` the backward's)."""

from __future__ import annotations

import math

import torch

# A floating tensor's NaN and Inf counts accumulate in int32 lanes (twice as many per vector as
# int64) below this many elements, exact there; above it in int64.
INT32_COUNTS = 2**31 - 1


def stats_vector_in_graph(t: torch.Tensor) -> torch.Tensor:
    """max, min, sum, sum of squares, NaN and Inf counts of ``t`` as a float64 vector, in pure
    torch ops dynamo traces (the widening and the rule: ``compiled_stats.py``'s doc).

    Only the two sums need the float64 widening. A floating tensor's max, min and counts are
    taken on the tensor as it is (exact in its own dtype, the same numbers as on the widening:
    widening is exact and keeps the order, NaN and the infinities), so inductor's kernel runs
    them on float32 lanes, 16 per AVX-512 vector where float64 has 8, with int32 counts
    (``benchmarks/compiled_stats_kernels.py``: about 1.5x less work per statistics kernel).
    The counts are compares (``x != x``: NaN; ``|x| == inf``: +-Inf), the same values as
    ``isnan``/``isinf``: inductor's CPU code vectorises compares, while for float64 it has no
    vector ``isnan``/``isinf`` and tests 16 values at a time one by one."""
    if t.numel() == 0:
        return torch.zeros(6, dtype=torch.float64, device=t.device)
    w = t.detach()
    if w.is_complex():
        w = w.abs()
    wide = w.to(torch.float64)
    if not w.is_floating_point():  # integers and booleans: everything on the widening
        w = wide
    counts = torch.int32 if w.numel() <= INT32_COUNTS else torch.int64
    nan = (w != w).sum(dtype=counts)
    inf = (w.abs() == math.inf).sum(dtype=counts)
    return torch.stack(
        [
            w.amax().to(torch.float64),
            w.amin().to(torch.float64),
            wide.sum(),
            (wide * wide).sum(),
            nan.to(torch.float64),
            inf.to(torch.float64),
        ]
    )
