"""Nothing summarised twice in a step: a module's input that is the previous module's output
(the same tensor, not modified since) reuses the output's statistics -- one reduction for
both records -- and one modified in place in between (its version counter moved) is
summarised again, with the values it has then."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pytest_precalign.recording import HookRecorder, tensor_capture
from pytest_precalign.recording.step_buffer import StepBuffer
from pytest_precalign.recording.tensor_summary import tensor_stats
from tests.helpers.stats_cases import counting_slots


class _Scale(nn.Module):
    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.in_place = in_place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2.0) if self.in_place else x * 2.0


class _Chain(nn.Module):
    def __init__(self, in_place: bool) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.scale = _Scale(in_place)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        self.scale(h)  # in place: h changes after a recorded it; else a new tensor, unused
        return self.b(h)


def _summaries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the tensors the recorder reduces: queued to the step's end (a device
    tensor) or read at capture (a CPU tensor)."""
    sizes: list[int] = []
    add = StepBuffer.add_stats

    def counting(self: StepBuffer, data: torch.Tensor) -> int:
        sizes.append(data.numel())
        return add(self, data)

    monkeypatch.setattr(StepBuffer, "add_stats", counting)
    monkeypatch.setattr(tensor_capture, "StatsSlots", counting_slots(sizes))
    return sizes


@pytest.mark.parametrize("in_place", [False, True], ids=["unchanged", "in_place"])
def test_the_next_modules_input_reuses_the_outputs_statistics_unless_changed(
    in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model, x = _Chain(in_place), torch.randn(3, 8)
    summaries = _summaries(monkeypatch)
    with torch.no_grad(), HookRecorder(model, mode="stats", inputs=True, grads=False) as rec:
        model(x)
    records = rec.trace().records
    with torch.no_grad():
        h = model.a(x)
    a_out = next(r for r in records if r.name == "a" and r.kind == "activation")
    b_in = next(r for r in records if r.name == "b" and r.kind == "input")
    if in_place:
        assert b_in.stats != a_out.stats and b_in.stats == tensor_stats(h.mul(2.0))
    else:
        assert b_in.stats == a_out.stats == tensor_stats(h)
    # 6 records (a, scale and b: input and output each), 4 reductions: x, a's output (also
    # scale's input), scale's output (a new tensor, or a's output changed in place: its version
    # moved) and b's output; b's input is a's output (unchanged) or scale's output (in place),
    # reduced already either way.
    assert len(records) == 6 and len(summaries) == 4
