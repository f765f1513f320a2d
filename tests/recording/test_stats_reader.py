"""``stats_reader()``, what a stats-mode recorder reads each CPU tensor's statistics with: the
same ``Stats``, bit for bit, as ``cpu_stats`` and ``tensor_stats`` on every tensor a recording
meets (the C kernel's, torch's for what it does not take: empty, integer, complex, not finite,
non-contiguous, larger than a piece); ``PRECALIGN_FUSED_STATS=0`` read when the reader
is made; and a recorder reads with it."""

from __future__ import annotations

import struct

import pytest
import torch

from pytest_precalign.recording import HookRecorder, native_kernels, tensor_capture
from pytest_precalign.recording.stats_slots import StatsSlots
from pytest_precalign.recording.tensor_summary import cpu_stats, new_stats, stats_reader, tensor_stats
from pytest_precalign.trace.records import Stats
from tests.helpers.stats_cases import counting_slots, stats_cases


def _bits(s: Stats) -> tuple[bytes, ...]:
    return (*(struct.pack("<d", v) for v in (s.max, s.min, s.mean, s.norm)), struct.pack("<qq", s.nan, s.inf))


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        **stats_cases(),
        "empty": torch.zeros(0, 3),
        "bool": torch.arange(7) % 2 == 0,
        "requires_grad": torch.randn(4, 8, generator=g).requires_grad_(),
    }


@pytest.mark.parametrize("name", list(_tensors()))
def test_the_reader_gives_cpu_stats_and_tensor_stats_bit_for_bit(name: str) -> None:
    t = _tensors()[name]
    read = stats_reader()
    got = read(t)
    assert _bits(got) == _bits(cpu_stats(t))
    assert _bits(got) == _bits(tensor_stats(t.detach()))


def test_turned_off_the_reader_is_torchs_and_the_setting_is_read_when_it_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRECALIGN_FUSED_STATS", "0")
    assert stats_reader() is cpu_stats
    monkeypatch.delenv("PRECALIGN_FUSED_STATS")
    made = stats_reader()
    if native_kernels.kernel_state() == "native":
        assert made is not cpu_stats


def test_a_fast_built_stats_is_the_dataclasss() -> None:
    fast, plain = new_stats(1.0, -2.0, 0.25, 3.0), Stats(1.0, -2.0, 0.25, 3.0)
    assert fast == plain and hash(fast) == hash(plain) and repr(fast) == repr(plain)
    assert fast.finite and fast.as_dict() == plain.as_dict()
    with pytest.raises(AttributeError):
        fast.max = 2.0  # type: ignore[misc]


def _record(model: torch.nn.Module, x: torch.Tensor) -> list[tuple[str, tuple[bytes, ...]]]:
    model.zero_grad(set_to_none=True)
    with HookRecorder(model, mode="stats") as rec:
        model(x).sum().backward()
    return [(r.id, _bits(r.stats)) for r in rec.trace().records if r.stats is not None]


def test_a_stats_mode_recorder_reads_each_cpu_tensor_with_the_one_reader_it_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model, x = (
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
        torch.randn(3, 4),
    )
    monkeypatch.setattr(tensor_capture, "StatsSlots", counting_slots([], lambda: cpu_stats))
    expected = _record(model, x)
    made: list[int] = []
    reads: list[int] = []
    counting = counting_slots(reads)

    def slots() -> StatsSlots:
        made.append(1)
        return counting()

    monkeypatch.setattr(tensor_capture, "StatsSlots", slots)
    got = _record(model, x)
    assert made == [1] and len(reads) >= 8  # x, 3 outputs, their grads, 4 parameter grads
    assert got == expected and len(got) > len(reads)  # inputs that are outputs: read once
