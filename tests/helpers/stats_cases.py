"""The tensors a recording meets, for the tests that hold a statistics path to another's bits
(``stats_vector``'s CPU path, ``stats_reader``): every dtype, constant, zero, denormal and
one-element tensors, -0.0, NaN/Inf (also in bf16), a norm that overflows, non-contiguous,
empty, integer, bool and complex ones, and the sizes read in pieces by torch and by the C
kernels; and a recorder's statistics slots that count what they read."""

from __future__ import annotations

from collections.abc import Callable

import torch

from pytest_precalign.recording import native_kernels
from pytest_precalign.recording.chunked_stats import CHUNKED_NUMEL
from pytest_precalign.recording.stats_slots import StatsSlots
from pytest_precalign.trace.records import Stats

Reader = Callable[[torch.Tensor], Stats]


def stats_cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_003, generator=g) * 3 + 1  # not a multiple of a block: a tail
    bad = x.clone()
    bad[[3, 7]] = float("nan")
    bad[11] = float("inf")
    return {
        "float32": x,
        "bfloat16": x.bfloat16(),
        "float16": x.half(),
        "float64": x.double(),
        "constant": torch.full((70_001,), 0.1),
        "all_zero": torch.zeros(4_097),
        "denormal": torch.full((5_000,), 1e-40),
        "one_element": torch.tensor([2.5]),
        "negative_zero": torch.tensor([-0.0, 0.0, -0.0]),
        "int64": torch.arange(-5, 50),
        "complex64": torch.complex(x[:1000], -x[:1000]),
        "nan_inf": bad,
        "only_inf": torch.tensor([float("inf"), float("-inf"), 1.0]),
        "bf16_nan": bad.bfloat16(),
        "overflowing_norm": torch.full((4,), 3e38),
        "non_contiguous": torch.randn(300, 701, generator=g).t(),
        "read_in_pieces": torch.randn(CHUNKED_NUMEL + 1, generator=g),
        "kernel_in_pieces": torch.randn(native_kernels.PART + 1001, generator=g) - 0.5,
    }


def counting_slots(sizes: list[int], read_with: Callable[[], Reader] | None = None) -> type[StatsSlots]:
    """A ``StatsSlots`` that appends the element count of each tensor it reads to ``sizes``
    (patched in as ``recording.tensor_capture.StatsSlots``); ``read_with``: a reader made for each
    recorder that reads instead of the slots (``Stats`` at once)."""

    class Counting(StatsSlots):
        def __init__(self) -> None:
            super().__init__()
            read = self.read if read_with is None else read_with()

            def counted(t: torch.Tensor) -> int | Stats:
                sizes.append(t.numel())
                return read(t)

            self.read = counted

    return Counting
