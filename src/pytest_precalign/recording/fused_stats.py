"""A device tensor's max, min, sum, L2 norm and NaN/Inf counts in ONE fused kernel, compiled
once by ``torch.compile`` (inductor, Triton) and kept in inductor's on-disk cache between runs.

Used automatically for CUDA tensors when Triton is importable (``fused_for``); every other
device (the CPU, NPUs) keeps the eager reductions (``tensor_summary.stats_vector``; the CPU
reads a large tensor once in pieces: ``chunked_stats.py``). ``PRECALIGN_FUSED_STATS=0`` turns
it off. The eager path on a device is five reads (``aminmax``, ``sum``, ``vector_norm``,
``isnan``, ``isinf``); here the counts come from the same read, so they cost nothing extra
and need no host sync to decide whether they are wanted.

Cost, measured on this repository's CPU-only machine (the CPU is not given this path):
compiling such a kernel took ~30 s the first time and ~5 s per new dtype, ~7 s of CPU when
inductor's cache was warm, and the compiled CPU kernel was slower than the eager reductions on
a 721K-element tensor (0.25 ms vs 0.19 ms): it pays only on large tensors and only once
compiled, hence not on the CPU. Shapes are dynamic: one compile per dtype, not per shape.
This path has not been run on a GPU here (none is lent): its test is skipped without one.

Values: max, min and the counts are exact; the sum and the norm are fp32 (fp64 for fp64)
tree reductions, within ``chunked_stats.SUM_ULPS`` epsilon of the exact values, not the bits of
the eager kernels. Equal tensors on the same kind of device get equal statistics.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

import torch


def fused_for(t: torch.Tensor) -> bool:
    """Whether ``t``'s statistics come from the fused kernel (see the module's doc)."""
    return (
        t.device.type == "cuda"
        and t.is_floating_point()
        and os.environ.get("PRECALIGN_FUSED_STATS", "1") != "0"
        and _triton_installed()
    )


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _six(t: torch.Tensor) -> torch.Tensor:
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    wide = t.reshape(-1).to(acc)
    values = torch.stack([wide.amax(), wide.amin(), wide.sum(), (wide * wide).sum().sqrt()])
    counts = torch.stack([torch.isnan(wide).sum(), torch.isinf(wide).sum()])
    return torch.cat([values.to(torch.float64), counts.to(torch.float64)])


@functools.cache
def _compiled() -> Callable[[torch.Tensor], torch.Tensor]:
    compiled: Callable[[torch.Tensor], torch.Tensor] = torch.compile(_six, dynamic=True, fullgraph=True)
    return compiled


def fused_vector(t: torch.Tensor) -> torch.Tensor:
    """``stats_vector(t, counts=True)`` of a non-empty device tensor in one fused pass."""
    return _compiled()(t)
