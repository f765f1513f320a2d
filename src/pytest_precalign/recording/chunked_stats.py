"""A large CPU tensor's max, min, sum and sum of squares from ONE read of its memory.

torch's eager CPU reductions each read the whole tensor: ``aminmax``, ``sum`` and
``vector_norm`` of a tensor larger than the last-level cache read it three times from DRAM.
Here the tensor is cut into ``CHUNK``-element pieces that fit in L2; each piece is read from
memory once and reduced three times while it is hot in cache (its max/min, its sum, its sum
of squares), and the pieces' values are combined. On this repository's 2-core machine, one
thread: see ``benchmarks/results/benchmarks.md`` (``benchmarks/stats_one_read.py``);
a tensor already in cache gains nothing (its three reductions are compute-bound), so only
tensors above ``CHUNKED_NUMEL`` take this path.

Values. Max and min are exact (the same as ``aminmax``). The sum and the sum of squares are
each piece's cascade sum in fp32 (fp64 for an fp64 tensor), added in float64 and rounded once
to that dtype. They are not the bits of torch's one-call reductions -- whose fp32
``vector_norm`` accumulates nearly serially: ~5,000 epsilon off the exact norm of a
16M-element tensor, and different again on two threads -- but closer to the exact values:
within ``SUM_ULPS`` epsilon of the dtype times the sum of |x| (the sum) and relative (the
norm, plus sqrt(n x the dtype's smallest subnormal) for squares that underflow, as in the
reference). ``tests/recording/test_one_read_stats.py`` checks both, and that the reference path is
never closer, on random, constant, zero, non-finite, denormal, half-type and fp64 tensors.
The values depend only on the tensor's values, size and dtype -- not on the thread count or
anything else -- so equal tensors still get equal statistics on both sides of a comparison.
(A non-contiguous tensor takes the one-call reductions: reading it in pieces would need a
contiguous copy, a second read.)
"""

from __future__ import annotations

import torch

# Elements per piece: 1 MiB of fp32, the L2 of this machine's cores (measured: 256K and
# 512K elements equally fast, 64K slower from per-operation overhead, 4M slower from L2 misses).
CHUNK = 1 << 18

# Tensors above this many elements are read in pieces (the same bound above which a
# one-call reduction went parallel before: larger than any cache it could stay in).
CHUNKED_NUMEL = 1 << 21

# The stated bound of the sum against the exact sum, in units of the accumulation dtype's
# epsilon times sum(|x|); of the norm against the exact norm, relative.
SUM_ULPS = 8


def chunked_values(t: torch.Tensor, acc: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(max, min, sum, L2 norm) of a contiguous floating CPU tensor, each a 0-d tensor in
    ``acc`` (float32, or float64 for a float64 tensor), from one read of ``t``'s memory."""
    pieces = t.reshape(-1).split(CHUNK)
    maxes, mins, sums, squares = [], [], [], []
    squared = torch.empty(min(CHUNK, t.numel()), dtype=acc)  # reused by every piece
    for piece in pieces:
        low, high = torch.aminmax(piece)
        wide = piece if piece.dtype == acc else piece.to(acc)  # in cache: no second DRAM read
        maxes.append(high)
        mins.append(low)
        sums.append(wide.sum())
        squares.append(torch.mul(wide, wide, out=squared[: wide.numel()]).sum())
    return (
        torch.stack(maxes).max().to(acc),
        torch.stack(mins).min().to(acc),
        torch.stack(sums).to(torch.float64).sum().to(acc),
        torch.stack(squares).to(torch.float64).sum().sqrt().to(acc),
    )
