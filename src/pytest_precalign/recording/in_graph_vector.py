"""The statistics vector of one tensor in pure torch ops dynamo traces into a compiled graph
(``compiled_stats.py`` takes the forward's, ``compiled_grads.py`` the backward's)."""

from __future__ import annotations

import math

import torch

# A floating tensor's NaN and Inf counts accumulate in int32 lanes (twice as many per vector as
# int64) below this many elements, exact there; above it in int64.
INT32_COUNTS = 2**31 - 1
# A float32, float16 or bfloat16 tensor is read in blocks of GROUP vectors of LANES elements
# (LANES: one AVX-512 vector of float32): the GROUP elements each lane sees are summed in
# float32 (at most three additions: the bound), the block sums then in float64
# (``stats_vector_in_graph``'s doc).
LANES = 16
GROUP = 4
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
    in blocks of 64 elements viewed as 4 vectors of 16 lanes: each lane's 4 values are summed
    (and their squares) in float32, three additions whatever their order, and the blocks' sums
    are added in float64; the elements past the last whole block, and every other tensor, are
    summed on their float64 widening. So the sum is within 3 * 2**-24 * sum|x| of the exact one
    and the sum of squares within 4 * 2**-24 of it relatively (one rounding of each square,
    three of its additions), the norm within 2 * 2**-24 (1.2e-7), plus the float64 sums'
    rounding (n / 64 * 2**-53). All six statistics are taken from the same 4 vectors of a block
    (reductions of 4 elements, which inductor unrolls), so inductor makes one pass over the
    tensor with them and widens only the block sums to float64
    (``benchmarks/compiled_stats_kernels.py``). The counts are compares (``x != x``: NaN;
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


def _blocks(g: torch.Tensor, counts: torch.dtype) -> torch.Tensor:
    """The vector of ``g`` (blocks, GROUP, LANES): each statistic over the GROUP vectors
    element-wise (reductions of GROUP elements, which inductor unrolls into the loop), then over
    the blocks and lanes (see ``stats_vector_in_graph``)."""
    g = g.float()
    return torch.stack(
        [
            g.amax(1).amax().to(torch.float64),
            g.amin(1).amin().to(torch.float64),
            g.sum(1).to(torch.float64).sum(),
            (g * g).sum(1).to(torch.float64).sum(),
            (g != g).sum(1, dtype=counts).sum(dtype=counts).to(torch.float64),
            (g.abs() == math.inf).sum(1, dtype=counts).sum(dtype=counts).to(torch.float64),
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
