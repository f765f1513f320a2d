"""Stats mode on a ``torch.compile``'d model: the statistics are computed inside the compiled
graph, so recording keeps its graphs whole (dynamo's graph and break counts are those of the
model unrecorded) and its numbers bitwise (the statistics are extra outputs of the graph; the
model's own kernels are not changed by them).

Each module of the model gets a forward pre-hook and a forward hook once, for the model's life
(``in_graph_stats``): bodies of pure torch ops dynamo traces into the graph, each appending its
module call's statistics to ``InGraphStats.calls`` (a side effect dynamo replays after the graph
runs; the statistics tensors are outputs of the graph). Whether a step is recorded is
``InGraphStats.on``, a Python attribute dynamo guards on: a recorded step runs a variant
compiled with the statistics, an unrecorded one the variant without them (each compiled once,
then kept in dynamo's cache). The hooks stay: dynamo does not see hooks added or removed after it
traced a module (``torch._dynamo.config.skip_nnmodule_hook_guards``), and a graph traced with
them keeps running their bodies after they were removed; so they must be there before the
model's first compiled forward (``Recorder.start`` adds them also on the steps it does not
record) and are never removed.

The statistics of each tensor, as one float64 vector: max, min, sum, sum of squares, NaN count,
Inf count (complex as ``|t|``), all six from one pass over the tensor (``in_graph_vector.py``):
max, min and the counts exact; a float32, float16 or bfloat16 tensor's sums added 4 values per
lane in float32 and the rest in float64, so the sum within 3 * 2**-24 * sum|x| and the
norm within 2 * 2**-24 relatively of the exact values; other tensors' sums on the float64
widening (``docs/training.md``, torch.compile).
They are read when the step ends, all in one conversion (one host sync).

Backward: the grads of module outputs (``grad_output``) and of module inputs (``grad_input``)
are computed inside the compiled backward graph too (``compiled_grads.py``: each output that
requires grad passes through an identity autograd function whose backward computes the
statistics of its grad; an input takes the row of the output it is, or is rebased in place on
the same function). Parameter grads are recorded by their post-accumulate hooks, which run in
eager autograd after the compiled backward.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from ..trace.records import Stats
from .compiled_grads import GradSink
from .host_sync import to_host
from .in_graph_vector import stats_vector_in_graph
from .module_names import class_name, clean, is_wrapper
from .tensor_summary import flatten

# One tensor of a module call: slot, dtype, shape, requires_grad, statistics vector (see above).
Entry = tuple[str, torch.dtype, Sequence[int], bool, torch.Tensor]
# A call's grads: its forward's serial number (a tensor), each tensor's row in the grad sink
# (``GradSink.wrap``, ``GradSink.wrap_inputs``: negative, why none) and whether the call owns the
# row (an output's, an input rebased at this call) or takes it from a tensor measured before.
GradRows = tuple[torch.Tensor, tuple[int, ...], tuple[bool, ...]]
# One module call's inputs ("input", at its pre-hook) or outputs ("activation", at its hook).
Call = tuple[str, str, tuple[Entry, ...], GradRows]


def _entries(tensors: list[tuple[str, torch.Tensor]]) -> tuple[Entry, ...]:
    return tuple((slot, t.dtype, t.shape, t.requires_grad, stats_vector_in_graph(t)) for slot, t in tensors)


class InGraphStats:
    """The hooks of one model (see the module's doc); ``on``: this step is recorded."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.on = False
        self.calls: list[Call] = []
        self.names: dict[str, str] = {}  # module name -> class name
        modules = 0
        for name, module in model.named_modules():
            name = clean(name)  # the model's own names and classes (module_names.py)
            if not name or is_wrapper(module):
                continue
            self.names[name] = class_name(module)
            module.register_forward_pre_hook(partial(self._entered, name), with_kwargs=True)
            module.register_forward_hook(partial(self._left, name), with_kwargs=True)
            modules += 1
        model.register_forward_hook(self._ended)
        param = next(model.parameters(), None)
        device = torch.device("cpu") if param is None or param.is_meta else param.device
        # Rows for the outputs (and inputs rebased, compiled_grads.py) of one forward: 4 per module.
        self.grads = GradSink(4 * modules + 16, device)

    def _entered(
        self, name: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if not self.on:
            return
        tensors = flatten(args, "in") + flatten(kwargs, "in")
        entries = _entries(tensors)  # the statistics of the inputs before any is rebased
        rows, owns = self.grads.wrap_inputs([t for _, t in tensors])
        self.calls.append((name, "input", entries, (self.grads.serial, rows, owns)))

    def _left(
        self, name: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> Any:
        if not self.on:
            return None
        entries = _entries(flatten(output, "out"))
        output, rows = self.grads.wrap(output)
        self.calls.append((name, "activation", entries, (self.grads.serial, rows, (True,) * len(rows))))
        return output

    def _ended(self, *hook_args: Any) -> None:
        """The model's forward ended: its tensors are not the next forward's inputs.

        The hook's arguments stay packed (``module, args, output``): where dynamo compiles this
        hook as a frame of its own (a recompile after a forward no backward followed), it reads
        the frame's named locals, and reading a non-leaf output's ``.grad`` warns (an error
        under ``-W error``)."""
        if self.on:
            self.grads.seen.clear()

    def take(self) -> list[Call]:
        """The module calls recorded since the last ``take`` (and forgets them)."""
        calls = self.calls[:]  # the list itself stays: the compiled graph appends to it
        self.calls.clear()
        return calls


_STATES: weakref.WeakKeyDictionary[torch.nn.Module, InGraphStats] = weakref.WeakKeyDictionary()


def in_graph_stats(model: torch.nn.Module) -> InGraphStats:
    """``model``'s hooks, added the first time it is asked for (see the module's doc)."""
    state = _STATES.get(model)
    if state is None:
        state = _STATES[model] = InGraphStats(model)
    return state


def fetch_vectors(vectors: Sequence[torch.Tensor]) -> list[list[float]]:
    """1-D float64 tensors (of any lengths) on the host, in order: one conversion per device
    (``to_host``)."""
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(vectors):
        by_device.setdefault(v.device, []).append(i)
    rows: list[list[float]] = [[] for _ in vectors]
    for index in by_device.values():
        flat: list[float] = to_host(torch.cat([vectors[i] for i in index]))
        at = 0
        for i in index:
            n = vectors[i].numel()
            rows[i] = flat[at : at + n]
            at += n
    return rows


def vector_stats(row: Sequence[float], shape: Sequence[int]) -> Stats:
    """The ``Stats`` of a tensor of ``shape`` from its host statistics vector."""
    numel = math.prod(shape)
    if not numel:
        return Stats(0.0, 0.0, 0.0, 0.0)
    vmax, vmin, vsum, squares, nan, inf = row
    return Stats(vmax, vmin, vsum / numel, math.sqrt(squares), int(nan), int(inf))
