"""Statistics of CPU tensors are reduced on one thread
(``tensor_summary.stats_vector``): their values do not depend on torch's thread count, and the
user's thread count is what the model's own code runs with, before, during and after recording."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.tensor_summary import tensor_stats


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def test_statistics_do_not_depend_on_the_thread_count(two_threads: None) -> None:
    # 1M elements: a parallel fp32 sum on 2 threads rounds differently from
    # one thread (main: mean 0.99645865 on 2 threads, 0.99645853 on 1).
    t = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)) * 3 + 1
    on_two = tensor_stats(t)
    torch.set_num_threads(1)
    on_one = tensor_stats(t)
    assert on_two == on_one
    assert torch.get_num_threads() == 1


class _Seen(torch.nn.Module):
    """A layer that notes the thread count its forward runs with."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.threads: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.threads.append(torch.get_num_threads())
        return torch.relu(self.lin(x))


def test_the_model_runs_with_the_users_thread_count(two_threads: None) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Seen(), _Seen(), _Seen())
    x = torch.randn(128, 64)
    with HookRecorder(model, mode="stats") as rec:
        model(x).sum().backward()
    trace = rec.trace()
    assert [layer.threads for layer in model if isinstance(layer, _Seen)] == [[2], [2], [2]]
    assert torch.get_num_threads() == 2
    assert all(r.stats is not None for r in trace.records)
    assert len(trace.records) > 10
