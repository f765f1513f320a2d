"""Stats mode under ``torch.compile``: the module outputs' grads (kind ``grad_output``), their
statistics computed inside the compiled backward graph, so the graphs stay whole and the numbers
bitwise (``compiled_stats.py`` does the forward's).

In the traced forward, each module output that requires grad passes through ``_GradStats``, an
identity ``torch.autograd.Function`` (the tensor itself comes out, as torch's own backward hooks
do) that also takes ``GradSink.sink``, a leaf tensor of ``GradSink.capacity`` rows made outside
the graph. Its backward hands the grad on unchanged and gives the sink, as the sink's grad, the
statistics vector of that grad (``stats_vector_in_graph``) in the call's row, plus a delivery
count and the forward's serial number: AOT autograd keeps all of it in the compiled backward
graph, and autograd accumulates the sink's grad after it (the rows are disjoint: adding zeros is
exact). A post-accumulate hook on the sink takes each backward's grad (``GradSink.delivered``).

Rows are numbered from 0 in each forward and each forward has a serial number
(``GradSink.serial``, a tensor the graph reads: dynamo guards on its dtype and shape, not on the
object), both set anew outside the graph after each backward (the sink's hook) and when a
recorded step starts: a row is read only from the backward whose serial column is its forward's
and whose count is 1; one delivered twice, by no backward, or by a backward that mixed two
forwards' grads in one row is listed as not recordable with the reason (fail closed). Two
forwards before one backward number their rows on (the second one's graph guards on the row it
starts at: one recompile). Rows past the capacity, outputs on another device than the sink,
and outputs nested deeper than one tuple, list or mapping (not rebuilt here), are listed
likewise.

The grads w.r.t. module *inputs* (``grad_input``) stay not recorded: the eager recorder's is the
input tensor's whole grad (a residual's use included), which an identity on the module's own
use of it does not see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any

import torch

from .in_graph_vector import stats_vector_in_graph

WIDTH = 8  # the statistics vector (6), the delivery count, the forward's serial number

NOT_DELIVERED = (
    "no backward delivered it: no grad reached the output where the module's caller used it (the "
    "eager recorder's also counts uses inside the module, e.g. an attention's returned weights)"
)
MIXED = (
    "its backward mixed grads of several forwards (or ran twice): the compiled graph's statistics "
    "of it cannot be told apart"
)
OVERFLOW = "more module outputs in one forward than the recorder's {capacity} in-graph slots"
ELSEWHERE = "on another device than the recorder's in-graph slots (the model's first parameter's)"
NESTED = "an output nested deeper than one tuple, list or mapping: its grad has no in-graph statistics"


class _GradStats(torch.autograd.Function):
    """Identity on ``x``; its backward puts the statistics of ``x``'s grad in row ``row`` of the
    sink's grad (see the module's doc)."""

    @staticmethod
    def forward(
        ctx: Any, sink: torch.Tensor, serial: torch.Tensor, row: int, x: torch.Tensor
    ) -> torch.Tensor:
        ctx.row, ctx.rows = row, sink.shape[0]
        ctx.save_for_backward(serial)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, torch.Tensor]:
        (serial,) = ctx.saved_tensors
        one = torch.ones(1, dtype=torch.float64, device=grad.device)
        vector = torch.cat([stats_vector_in_graph(grad), one, serial.reshape(1)])
        rows = torch.zeros(ctx.rows, WIDTH, dtype=torch.float64, device=grad.device)
        return rows.select_scatter(vector, 0, ctx.row), None, None, grad


class GradSink:
    """Where one model's in-graph grad statistics come out (see the module's doc)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.sink = torch.zeros(capacity, WIDTH, dtype=torch.float64, device=device, requires_grad=True)
        self.device, self.forwards = device, 0
        self.serial = torch.zeros((), dtype=torch.float64, device=device)
        self.next_row = 0
        self.delivered: list[torch.Tensor] = []  # each backward's sink grad
        self.sink.register_post_accumulate_grad_hook(self._take)

    def _take(self, sink: torch.Tensor) -> None:
        if sink.grad is not None:
            self.delivered.append(sink.grad)
            sink.grad = None
        self.begin()

    def begin(self) -> None:
        """Outside the graph: the next forward's rows from 0, under a new serial number."""
        self.forwards += 1
        self.next_row = 0
        self.serial = torch.full((), float(self.forwards), dtype=torch.float64, device=self.device)

    def wrap(self, output: Any) -> tuple[Any, tuple[int, ...]]:
        """``output`` with each tensor that requires grad passed through ``_GradStats`` (a tuple
        or list rebuilt, a mapping's values set in place), and the row of each tensor of
        ``flatten(output)`` (-1: none, -2: past the capacity, -3: on another device; empty: nested)."""
        if isinstance(output, torch.Tensor):
            out, row = self._one(output)
            return out, (row,)
        if type(output) in (tuple, list):
            items = list(enumerate(output))
        elif isinstance(output, MutableMapping):
            items = list(output.items())
        else:
            return output, ()
        if any(isinstance(v, (tuple, list, Mapping)) or dataclasses.is_dataclass(v) for _, v in items):
            return output, ()  # flatten's slots go deeper: not rebuilt here
        done = {k: self._one(v) for k, v in items if isinstance(v, torch.Tensor)}
        rows = tuple(row for _, row in done.values())
        if not isinstance(output, MutableMapping):
            return type(output)(done[k][0] if k in done else v for k, v in items), rows
        for k, (out, _) in done.items():
            output[k] = out
        return output, rows

    def _one(self, t: torch.Tensor) -> tuple[torch.Tensor, int]:
        if not t.requires_grad:
            return t, -1
        if t.device != self.sink.device:  # its grad could not be handed to the sink
            return t, -3
        row = self.next_row
        if row >= self.capacity:
            return t, -2
        self.next_row = row + 1
        out: torch.Tensor = _GradStats.apply(self.sink, self.serial, row, t)  # type: ignore[no-untyped-call]
        return out, row

    def take(self) -> list[torch.Tensor]:
        """The backwards' sink grads delivered since the last ``take`` (and forgets them)."""
        delivered, self.delivered = self.delivered, []
        return delivered


def pick_row(delivered: list[list[list[float]]], serial: float, row: int) -> list[float] | str:
    """The statistics vector of ``row`` of the forward numbered ``serial`` from the backwards'
    host rows, or why there is none (see the module's doc): a row delivered once by one backward
    carries count 1 and its forward's serial; one two deliveries met in has a count above 1."""
    mine = [r for d in delivered if (r := d[row])[6] == 1.0 and r[7] == serial]
    if len(mine) == 1:
        return mine[0][:6]
    if mine or any(d[row][6] > 1.0 for d in delivered):
        return MIXED
    return NOT_DELIVERED
