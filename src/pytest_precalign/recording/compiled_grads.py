"""Stats mode under ``torch.compile``: the grads of module outputs and inputs (kinds
``grad_output``, ``grad_input``), their statistics computed inside the compiled backward graph,
so the graphs stay whole and the numbers bitwise (``compiled_stats.py`` does the forward's).

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

The grads w.r.t. module *inputs* (``grad_input``): the eager recorder's is the input tensor's
whole grad (every use of it: a residual's too), so an identity on the module's own use of it
would give another tensor. Instead each tensor that gets a row in a forward (``GradSink.seen``,
cleared when the model's forward ends) is measured once, for every module it reaches:

- an input that is an output wrapped above (most are: the previous layer's, a norm's) takes
  that output's row: its grad is the same tensor, whose statistics the graph computes once;
- another non-leaf input (a residual sum, ``act(gate) * up`` before ``down_proj``) passes through
  ``_InputGradStats``, the same identity applied in place (``mark_dirty``): every later use of
  the tensor, the caller's included, goes through it, so its backward sees the grad of all the
  uses from the module's call on (the eager one also counts uses before the call: none in the
  usual layer; where there are, the compare shows a divergence, never a silent pass); later
  modules given the same tensor take its row;
- a leaf (a parameter or a tensor made outside the model), a view (rebasing one in place would
  change its base's history) and a module run outside a compiled graph (dynamo's fallback to
  eager: an in-place rebase there could trip autograd's saved-tensor checks) are listed as not
  recordable with the reason.
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
LEAF = (
    "a leaf tensor (a parameter, or a tensor made outside the model) given to the module: the "
    "compiled graph cannot measure its whole grad"
)
VIEW = (
    "a view made between modules (not another module's output): the compiled graph measures no "
    "view's grad (rebasing it in place would change its base's history)"
)
NOT_IN_GRAPH = (
    "the module ran outside a compiled graph (dynamo fell back to eager): its inputs' grads are "
    "measured only inside one"
)
# Rows of the tensors that get none: (no grad, past the capacity, elsewhere, leaf, view, eager)
NO_GRAD, PAST, ELSE, IS_LEAF, IS_VIEW, EAGER = -1, -2, -3, -5, -6, -7


def _sink_grad(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    """The sink's grad: ``grad``'s statistics vector, count 1 and the forward's serial number in
    row ``ctx.row``, zeros elsewhere."""
    (serial,) = ctx.saved_tensors
    one = torch.ones(1, dtype=torch.float64, device=grad.device)
    vector = torch.cat([stats_vector_in_graph(grad), one, serial.reshape(1)])
    rows = torch.zeros(ctx.rows, WIDTH, dtype=torch.float64, device=grad.device)
    return rows.select_scatter(vector, 0, ctx.row)


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
        return _sink_grad(ctx, grad), None, None, grad


class _InputGradStats(_GradStats):
    """``_GradStats`` in place: ``x`` itself comes out, its autograd history rebased on this
    function, so every later use of ``x`` goes through it (see the module's doc); the same
    backward."""

    @staticmethod
    def forward(
        ctx: Any, sink: torch.Tensor, serial: torch.Tensor, row: int, x: torch.Tensor
    ) -> torch.Tensor:
        ctx.mark_dirty(x)
        return _GradStats.forward(ctx, sink, serial, row, x)


class GradSink:
    """Where one model's in-graph grad statistics come out (see the module's doc)."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.sink = torch.zeros(capacity, WIDTH, dtype=torch.float64, device=device, requires_grad=True)
        self.device, self.forwards = device, 0
        self.serial = torch.zeros((), dtype=torch.float64, device=device)
        self.next_row = 0
        self.delivered: list[torch.Tensor] = []  # each backward's sink grad
        self.seen: list[tuple[torch.Tensor, int]] = []  # this forward's measured tensors, rows
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
        self.seen.clear()
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
        row = self._row(t)
        if row < 0:
            return t, row
        out: torch.Tensor = _GradStats.apply(self.sink, self.serial, row, t)  # type: ignore[no-untyped-call]
        self.seen.append((out, row))
        return out, row

    def _row(self, t: torch.Tensor) -> int:
        """The next row, for ``t``'s grad, or why none (``NO_GRAD``, ``ELSE``, ``PAST``)."""
        if not t.requires_grad:
            return NO_GRAD
        if t.device != self.sink.device:  # its grad could not be handed to the sink
            return ELSE
        row = self.next_row
        if row >= self.capacity:
            return PAST
        self.next_row = row + 1
        return row

    def wrap_inputs(self, tensors: list[torch.Tensor]) -> tuple[tuple[int, ...], tuple[bool, ...]]:
        """The row of each input tensor's grad (negative: why none) and whether this call owns it
        (its input rebased here) rather than takes the row of a tensor measured before in this
        forward (see the module's doc)."""
        rows: list[int] = []
        owns: list[bool] = []
        for t in tensors:
            row, own = self._input(t)
            rows.append(row)
            owns.append(own)
        return tuple(rows), tuple(owns)

    def _input(self, t: torch.Tensor) -> tuple[int, bool]:
        if not t.requires_grad:
            return NO_GRAD, False
        for seen, row in reversed(self.seen):  # most inputs are the outputs just made
            if seen is t:
                return row, False
        if not torch.compiler.is_compiling():
            return EAGER, False
        if t.is_leaf:
            return IS_LEAF, False
        if t._base is not None:  # a view (dynamo traces ``_base``, not ``_is_view()``)
            return IS_VIEW, False
        row = self._row(t)
        if row >= 0:
            _InputGradStats.apply(self.sink, self.serial, row, t)  # type: ignore[no-untyped-call]
            self.seen.append((t, row))
        return row, row >= 0

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
