"""``StatsSlots``, what a stats-mode recorder reads each CPU tensor's statistics into: a slot the
C kernel writes, made ``Stats`` at the step's end with the bits of ``stats_reader`` (and of
``cpu_stats``); a tensor the kernel does not take is read at once; more tensors than a chunk
of slots; the slots used again after ``clear``; and a record returned before the step ends
already has its statistics."""

from __future__ import annotations

import struct

import pytest
import torch

from pytest_precalign.recording import HookRecorder, native_kernels
from pytest_precalign.recording.stats_slots import StatsSlots
from pytest_precalign.recording.tensor_summary import cpu_stats, stats_reader
from pytest_precalign.trace.records import Stats
from tests.helpers.stats_cases import stats_cases


def _bits(s: Stats) -> tuple[bytes, ...]:
    return (*(struct.pack("<d", v) for v in (s.max, s.min, s.mean, s.norm)), struct.pack("<qq", s.nan, s.inf))


def _as_stats(slots: StatsSlots, got: int | Stats, t: torch.Tensor) -> Stats:
    return slots.stats(got, t.numel()) if isinstance(got, int) else got


def test_every_case_has_the_readers_bits_whether_slotted_or_read_at_once() -> None:
    cases = {**stats_cases(), "empty": torch.zeros(0, 3), "bool": torch.arange(7) % 2 == 0}
    slots, read = StatsSlots(), stats_reader()
    got = {name: slots.read(t) for name, t in cases.items()}  # all read before any is made Stats
    for name, t in cases.items():
        assert _bits(_as_stats(slots, got[name], t)) == _bits(read(t)) == _bits(cpu_stats(t)), name
    slotted = {name for name, g in got.items() if isinstance(g, int)}
    if native_kernels.kernel_state() == "native":
        assert {"float32", "bfloat16", "float16", "float64", "constant", "all_zero"} <= slotted
    assert not slotted & {"nan_inf", "bf16_nan", "non_contiguous", "empty", "int64"}  # read at once


def test_more_tensors_than_a_chunk_and_the_slots_used_again_after_clear() -> None:
    if native_kernels.kernel_state() != "native":
        pytest.skip("the C kernels are not built here: every tensor is read at once")
    g = torch.Generator().manual_seed(3)
    tensors = [torch.randn(17 + i % 5, generator=g) * (i + 1) for i in range(2500)]
    slots = StatsSlots()
    for _ in range(2):
        got = [slots.read(t) for t in tensors]
        assert got == list(range(len(tensors)))  # one slot each, in order, from 0 again
        for index, t in zip(got, tensors, strict=True):
            assert _bits(slots.stats(index, t.numel())) == _bits(cpu_stats(t))
        slots.clear()


def test_a_record_taken_before_the_step_ends_has_its_statistics_and_ids() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(3, 4)
    with HookRecorder(model, mode="stats") as rec:
        out = model(x)
        logits = rec.record_output("logits", out)
        loss = rec.record_output("loss", out.sum(), deps=(logits.id,))
        assert logits.stats == cpu_stats(out.detach()) and loss.deps == (logits.id,)
        out.sum().backward()
    records = {r.id: r for r in rec.trace().records}
    assert records[logits.id] == logits and records[loss.id] == loss
    relu_in, relu_out = records["1|input|in.0|0|0"], records["1|activation|out|0|0"]
    assert relu_out.deps == (relu_in.id,) and relu_out.stats == logits.stats  # one tensor, one read
    assert relu_in.deps == () and relu_in.stats == records["0|activation|out|0|0"].stats
    assert records["0|activation|out|0|0"].deps == ("0|input|in.0|0|0",)
