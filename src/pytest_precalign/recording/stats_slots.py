"""A stats-mode recorder's CPU statistics, read at capture into slots of host memory and turned
into ``Stats`` when the step ends.

A hook runs right after a torch operation has pushed the interpreter's own data out of the
caches, so every object it makes costs misses there; the C kernel (``native_kernels``) writes a
tensor's max, min, sum and sum of squares straight into the next free slot (four doubles), and
the step's end makes the ``Stats`` of all of them in one loop, with the very arithmetic
``tensor_summary.stats_reader`` uses (the same bits: ``tests/recording/test_stats_slots.py``).
A tensor the kernel does not take (no kernel for its dtype, too large for one read, not
contiguous, a value not finite) is read by ``stats_reader`` at once and its ``Stats`` returned.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
from collections.abc import Callable

import torch

from ..trace.records import Stats
from . import native_kernels
from .tensor_summary import new_stats, stats_reader

_SLOTS_PER_CHUNK = 1024
_SLOT_BYTES = 32  # four doubles: max, min, sum, sum of squares


class StatsSlots:
    """Slots of host memory the kernels write statistics into; ``read`` returns a slot's index
    or, for a tensor the kernels do not take, its ``Stats``; ``stats(index, numel)`` after the
    step. ``clear()`` when every slot has been turned into ``Stats``: the slots are used again."""

    def __init__(self) -> None:
        self._chunks: list[ctypes.Array[ctypes.c_double]] = []
        self._addresses: list[int] = []
        self._next = itertools.count()  # next() is atomic: hooks of two autograd threads
        self.read: Callable[[torch.Tensor], int | Stats] = self._reader()

    def _reader(self) -> Callable[[torch.Tensor], int | Stats]:
        entries = native_kernels.stats_entries()
        fallback = stats_reader()
        if entries is None:
            return fallback
        part, strided, chunks, addresses = native_kernels.PART, torch.strided, self._chunks, self._addresses
        tensor, parameter = torch.Tensor, torch.nn.Parameter  # no subclass reaches the kernels
        chunk_type, grow = ctypes.c_double * (4 * _SLOTS_PER_CHUNK), threading.Lock()

        def read(t: torch.Tensor) -> int | Stats:
            n, cls = t.numel(), type(t)
            if (
                (cls is tensor or cls is parameter)
                and 0 < n <= part
                and t.layout is strided
                and t.is_cpu
                and t.is_contiguous()
            ):
                entry = entries[t.dtype]
                if entry is not None:
                    index = next(self._next)
                    chunk, slot = divmod(index, _SLOTS_PER_CHUNK)
                    if chunk >= len(addresses):
                        with grow:  # chunks and their addresses in step
                            while chunk >= len(addresses):
                                chunks.append(new := chunk_type())
                                addresses.append(ctypes.addressof(new))
                    if entry(t.data_ptr(), n, addresses[chunk] + _SLOT_BYTES * slot):
                        return index
            return fallback(t)  # a value not finite: torch counts them (that slot stays unused)

        return read

    def stats(self, index: int, numel: int) -> Stats:
        """The ``Stats`` of slot ``index``, read from a tensor of ``numel`` elements."""
        chunk, slot = divmod(index, _SLOTS_PER_CHUNK)
        v, at = self._chunks[chunk], 4 * slot
        return new_stats(v[at], v[at + 1], v[at + 2] / numel, math.sqrt(v[at + 3]))

    def clear(self) -> None:
        self._next = itertools.count()
