"""The statistics vector of one tensor in pure torch ops dynamo traces into a compiled graph
(``compiled_stats.py`` takes the forward's, ``compiled_grads.py`` the backward's)."""

from __future__ import annotations

import math

import torch

# A floating tensor's NaN and Inf counts accumulate in int32 lanes (twice as many per vector as
# int64) below this many elements, exact there; above it in int64.
INT32_COUNTS = 2**31 - 1
# A float32, float16 or bfloat16 tensor is read in blocks of GROUP vectors of LANES elements
# (LANES: one AVX-512 vector of float32): the GROUP elements each lane sees are summed pairwise
# in float32, the block sums then in float64 (the bound: ``stats_vector_in_graph``'s doc).
LANES = 16
GROUP = 8
BLOCK = GROUP * LANES
GROUPED = (torch.float32, torch.float16, torch.bfloat16)
# The bound of the two sums (first order, see ``stats_vector_in_graph``; docs/training.md): the
# sum within SUM_BOUND * sum|x| of the exact one, the norm within NORM_BOUND relatively.
SUM_BOUND = 3 * 2**-24
NORM_BOUND = 2 * 2**-24


def stats_vector_in_graph(t: torch.Tensor) -> torch.Tensor:
    """max, min, sum, sum of squares, NaN and Inf counts of ``t`` as a float64 vector, in pure
    torch ops dynamo traces (the rule: ``compiled_stats.py``'s doc, docs/training.md).

    max, min and the counts are exact. A contiguous float32, float16 or bfloat16 tensor is read
    in blocks of 128 elements viewed as 8 vectors of 16 lanes: each lane's 8 values are summed
    (and their squares) pairwise in float32, three additions deep, and the blocks' sums are
    added in float64; the elements past the last whole block, and every other tensor, are summed
    on their float64 widening. So the sum is within 3 * 2**-24 * sum|x| of the exact one and the
    sum of squares within 4 * 2**-24 of it relatively (one rounding of each square, three of its
    pairwise sums), the norm within 2 * 2**-24 (1.2e-7), plus the float64 sums' rounding
    (n / 128 * 2**-53). All six statistics are taken from the same 8 vectors of a block, so
    inductor makes one pass over the tensor with them (no float64 conversion of each element:
    ``benchmarks/compiled_stats_kernels.py``). The counts are compares (``x != x``: NaN;
    ``|x| == inf``: +-Inf): inductor vectorises those, not ``isnan``/``isinf`` on float64."""
    if t.numel() == 0:
        return torch.zeros(6, dtype=torch.float64, device=t.device)
    w = t.detach()
    if w.is_complex():
        w = w.abs()
    if w.dtype in GROUPED and w.is_contiguous() and w.numel() >= BLOCK:
        flat = w.reshape(-1)
        head = flat.numel() - flat.numel() % BLOCK
        blocks = _blocks(flat[:head].view(-1, GROUP, LANES), _count_dtype(flat))
        if head == flat.numel():
            return blocks
        rest = _widened(flat[head:])
        return torch.stack(
            [
                torch.maximum(blocks[0], rest[0]),
                torch.minimum(blocks[1], rest[1]),
                *(blocks[2:] + rest[2:]).unbind(),
            ]
        )
    return _widened(w)


def _count_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.int32 if t.numel() <= INT32_COUNTS else torch.int64


def _pairwise(parts: list[torch.Tensor]) -> torch.Tensor:
    """((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)): element-wise, in the parts' dtype."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] for i in range(0, len(parts), 2)]
    return parts[0]


def _blocks(g: torch.Tensor, counts: torch.dtype) -> torch.Tensor:
    """The vector of ``g`` (blocks, GROUP, LANES): each statistic of the GROUP vectors element-wise,
    then over the blocks and lanes (see ``stats_vector_in_graph``)."""
    parts = [g[:, i].float() for i in range(GROUP)]
    top, bottom = parts[0], parts[0]
    for p in parts[1:]:
        top, bottom = torch.maximum(top, p), torch.minimum(bottom, p)
    nan = _pairwise([(p != p).to(counts) for p in parts]).sum(dtype=counts)
    inf = _pairwise([(p.abs() == math.inf).to(counts) for p in parts]).sum(dtype=counts)
    return torch.stack(
        [
            top.amax().to(torch.float64),
            bottom.amin().to(torch.float64),
            _pairwise(parts).to(torch.float64).sum(),
            _pairwise([p * p for p in parts]).to(torch.float64).sum(),
            nan.to(torch.float64),
            inf.to(torch.float64),
        ]
    )


def _widened(w: torch.Tensor) -> torch.Tensor:
    """The vector with both sums on the float64 widening; a floating tensor's max, min and counts
    on the tensor as it is (the same numbers: widening is exact and keeps the order, NaN and the
    infinities), an integer or boolean tensor's on the widening."""
    wide = w.to(torch.float64)
    if not w.is_floating_point():
        w = wide
    counts = _count_dtype(w)
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
