"""Stats mode under ``torch.compile``, on the recorder's side: the module calls the compiled
graph recorded (``compiled_stats.InGraphStats``) turned into the recorder's drafts, their
statistics fetched when the step ends (one host sync per device), the grads of their inputs
and outputs listed as not recordable, and the manifest's ``"compiled"`` note."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from ..trace.records import Record, Stats, record_id
from ..vocabulary import Kind
from .calls import _Call
from .compiled import SPLITS_GRAPH
from .compiled_stats import NOT_RECORDED, Entry, fetch_vectors, in_graph_stats, vector_stats
from .record_factory import Draft

# A compiled model whose graph was traced before the in-graph hooks were added.
NOT_TRACED = (
    "recorder: no module call of the compiled model was recorded: its graph was compiled before "
    "the recorder's hooks were added (dynamo does not see hooks added later); start recording "
    "(Recorder.start, or enter HookRecorder) before the model's first compiled forward"
)


def splits_note(mode: str, level: str) -> dict[str, Any]:
    """The ``"compiled"`` note of a recording whose hooks ran outside the compiled graph."""
    return {"stats": "outside the graph", "note": SPLITS_GRAPH.format(mode=mode, level=level)}


class CompiledRecords:
    """One recorder's records of a compiled model's in-graph statistics (see the module doc)."""

    def __init__(
        self, model: torch.nn.Module, selected: Callable[[str], bool], inputs: bool, grads: bool
    ) -> None:
        self.graph = in_graph_stats(model)
        self.selected, self.inputs, self.grads = selected, inputs, grads
        self.vectors: list[tuple[int, torch.Tensor]] = []  # (seq, statistics vector)
        self.open: dict[str, list[tuple[int, tuple[int, ...]]]] = {}  # name -> (call, input seqs)

    def start(self) -> None:
        self.graph.take()  # calls of a step recorded before and never taken
        self.graph.on = True

    def stop(self) -> None:
        self.graph.on = False

    def drain(
        self,
        records: list[Record | Draft],
        calls: dict[tuple[str, int], int],
        last_call: dict[str, _Call],
        not_recordable: dict[str, str],
        step: int,
    ) -> None:
        """The module calls recorded since the last drain, appended to ``records`` as drafts
        (``calls``: the recorder's call counts; ``last_call``: each module's last call, the
        deps of its parameters' grads); their inputs' and outputs' grads in ``not_recordable``."""
        if not self.graph.calls:
            return
        for name, kind, entries in self.graph.take():
            if not self.selected(name):
                continue
            cls, key, open_calls = self.graph.names[name], (name, step), self.open.setdefault(name, [])
            if kind == "input":
                call = calls.get(key, 0)
                calls[key] = call + 1
                seqs = tuple(
                    self._draft(records, name, cls, "input", step, call, e, ())
                    for e in entries
                    if self.inputs
                )
                open_calls.append((call, seqs))
                last_call[name] = _Call(name, cls, call, step, seqs, [])
                grad_kind: Kind = "grad_input"
            else:
                call, seqs = open_calls.pop() if open_calls else (max(calls.get(key, 1) - 1, 0), ())
                for entry in entries:
                    self._draft(records, name, cls, "activation", step, call, entry, seqs)
                grad_kind = "grad_output"
            for slot, _, _, requires_grad, _ in entries if self.grads else ():
                if requires_grad:
                    not_recordable[record_id(name, grad_kind, slot, step, call)] = NOT_RECORDED

    def _draft(
        self,
        records: list[Record | Draft],
        name: str,
        cls: str,
        kind: Kind,
        step: int,
        call: int,
        entry: Entry,
        deps: tuple[int, ...],
    ) -> int:
        slot, dtype, shape, _, vector = entry
        seq = len(records)
        records.append((name, cls, kind, step, call, slot, dtype, shape, deps, None, None, None))
        self.vectors.append((seq, vector))
        return seq

    def fetch(self, records: list[Record | Draft]) -> dict[int, tuple[Stats | None, str | None]]:
        """The ``Stats`` of the drafts made since the last fetch, by seq (one host sync per device)."""
        vectors, self.vectors = self.vectors, []
        fetched: dict[int, tuple[Stats | None, str | None]] = {}
        rows = fetch_vectors([v for _, v in vectors]) if vectors else []
        for (seq, _), row in zip(vectors, rows, strict=True):
            draft = records[seq]
            assert isinstance(draft, tuple)  # built at this step's end
            fetched[seq] = (vector_stats(row, draft[7]), None)
        return fetched

    def note(self, recorded_any: bool) -> dict[str, Any]:
        """The manifest's ``"compiled"`` note; warns when the graph never ran the hooks."""
        note: dict[str, Any] = {
            "stats": "in the graph",
            "not_recorded": {"grad_input": NOT_RECORDED, "grad_output": NOT_RECORDED},
        }
        if not self.open and recorded_any:
            note["forward"] = NOT_TRACED
            warnings.warn(NOT_TRACED, stacklevel=4)
        return note
