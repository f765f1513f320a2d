"""Module outputs the recorder looks into: a plain ``@dataclass`` is recorded field by field,
like a dict; keys that would collide once flattened (``0`` and ``"0"``, ``"a.b"`` and
``{"a": {"b": ...}}``) get distinct slots, so the trace passes the tool's own compare."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.tensor_summary import flatten


@dataclass
class Out:
    hidden: torch.Tensor
    extra: tuple[torch.Tensor, torch.Tensor]
    note: str = "not a tensor"


class DataclassBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Out:
        h = self.proj(x)
        return Out(h, (h * 2, h + 1))


class CollidingBlock(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[object, object]:
        return {0: x, "0": x * 2, "a.b": x + 1, "a": {"b": x + 2}}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = DataclassBlock()
        self.colliding = CollidingBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        d = self.colliding(out.hidden)
        return out.extra[0] + d[0] + d["0"] + d["a.b"] + d["a"]["b"]  # type: ignore[index,operator]


def test_slots_of_a_dataclass_and_of_colliding_keys_are_distinct() -> None:
    x = torch.ones(2)
    slots = [slot for slot, _ in flatten(CollidingBlock()(x), "out")]
    assert slots == ["out.0", "out.'0'", "out.'a.b'", "out.a.b"]
    h = torch.zeros(1)
    assert [s for s, _ in flatten(Out(h, (h, h)), "out")] == ["out.hidden", "out.extra.0", "out.extra.1"]


def test_a_flat_tuple_of_tensors_takes_the_nested_walks_slots() -> None:
    a, b = torch.zeros(1), torch.nn.Parameter(torch.ones(1))
    assert flatten((a, b), "in") == [("in.0", a), ("in.1", b)]
    assert flatten((a, [b]), "in") == [("in.0", a), ("in.1.0", b)]  # not flat: walked
    assert flatten((), "in") == [] and flatten((a, None), "in") == [("in.0", a)]


def test_a_model_with_such_outputs_is_recorded_and_compares_with_itself() -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 4)
    traces = []
    for _ in range(2):
        net.zero_grad(set_to_none=True)
        recorder = HookRecorder(net, mode="tensor", grads=True)
        with recorder:
            net(x).sum().backward()
        traces.append(recorder.trace({}))
    names = {(r.name, r.kind, r.slot) for r in traces[0].records}
    assert {("block", "activation", "out.hidden"), ("block", "activation", "out.extra.1")} <= names
    assert {("colliding", "activation", "out.'0'"), ("colliding", "activation", "out.a.b")} <= names
    ids = [r.id for r in traces[0].records]
    assert len(ids) == len(set(ids))  # no two records share an id
    result = compare_traces(traces[0], traces[1], default_table())
    assert result.pairs and all(p.passed for p in result.pairs if p.paired)
