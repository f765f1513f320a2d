"""The statistics vector of one tensor in pure torch ops dynamo traces into a compiled graph
(``compiled_stats.py`` takes the forward's, ``compiled_grads.py`` the backward's)."""

from __future__ import annotations

import math

import torch


def stats_vector_in_graph(t: torch.Tensor) -> torch.Tensor:
    """max, min, sum, sum of squares, NaN and Inf counts of ``t`` as a float64 vector, in pure
    torch ops dynamo traces (the widening and the rule: ``compiled_stats.py``'s doc)."""
    if t.numel() == 0:
        return torch.zeros(6, dtype=torch.float64, device=t.device)
    w = t.detach()
    if w.is_complex():
        w = w.abs()
    w = w.to(torch.float64)
    # The counts by compares (``x != x``: NaN; ``|x| == inf``: +-Inf), the same values as
    # ``isnan``/``isinf``: inductor's CPU code vectorises compares, while for float64 it has no
    # vector ``isnan``/``isinf`` and tests 16 values at a time one by one (most of the kernel's
    # time: ``benchmarks/compiled_stats_kernels.py``).
    nan, inf = w != w, w.abs() == math.inf
    return torch.stack(
        [
            w.amax(),
            w.amin(),
            w.sum(),
            (w * w).sum(),
            nan.sum().to(torch.float64),
            inf.sum().to(torch.float64),
        ]
    )
