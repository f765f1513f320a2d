"""Stats mode under ``torch.compile``, on the recorder's side: the module calls the compiled
graph recorded (``compiled_stats.InGraphStats``) turned into the recorder's drafts, their
statistics fetched when the step ends (one host sync per device), their outputs' grads from the
compiled backward (``compiled_grads.py``) and of their inputs, and the manifest's ``"compiled"``
note."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch

from ..trace.note_blocks import CompiledNote
from ..trace.records import Record, Stats, record_id
from ..vocabulary import Kind
from .calls import _Call
from .compiled import SPLITS_GRAPH
from .compiled_grads import (
    EAGER,
    ELSE,
    ELSEWHERE,
    IS_LEAF,
    IS_VIEW,
    LEAF,
    NESTED,
    NOT_IN_GRAPH,
    OVERFLOW,
    PAST,
    VIEW,
    WIDTH,
    pick_row,
)
from .compiled_stats import Entry, fetch_vectors, in_graph_stats, vector_stats
from .record_factory import Draft

DYNAMO_CTX = r"<class 'torch\.autograd\.function\.Function'> should not be instantiated"
# A compiled model whose graph was traced before the in-graph hooks were added.
NOT_TRACED = (
    "recorder: no module call of the compiled model was recorded: its graph was compiled before "
    "the recorder's hooks were added (dynamo does not see hooks added later); start recording "
    "(Recorder.start, or enter HookRecorder) before the model's first compiled forward"
)


NESTED_ROW = -4  # an output nested deeper than ``GradSink.wrap`` rebuilds


@dataclasses.dataclass
class _GradEvent:
    """One module call's output or input grad to draft, in backward order: after its owner of
    the row (the output or rebased input whose tensor it is) come the inputs that take the row
    (the eager recorder's hooks on one tensor run in the order they were added)."""

    name: str
    call: int
    kind: Kind
    entry: Entry
    serial: torch.Tensor
    row: int
    drafted: bool  # its module is selected and grads are recorded
    after: list[_GradEvent] = dataclasses.field(default_factory=list)


def splits_note(mode: str, level: str) -> CompiledNote:
    """The ``"compiled"`` note of a recording whose hooks ran outside the compiled graph."""
    return CompiledNote("outside the graph", note=SPLITS_GRAPH.format(mode=mode, level=level))


class CompiledRecords:
    """One recorder's records of a compiled model's in-graph statistics (see the module doc)."""

    def __init__(
        self, model: torch.nn.Module, selected: Callable[[str], bool], inputs: bool, grads: bool
    ) -> None:
        self.graph = in_graph_stats(model)
        self.selected, self.inputs, self.grads = selected, inputs, grads
        self.vectors: list[tuple[int, torch.Tensor]] = []  # (seq, statistics vector)
        self.open: dict[str, list[tuple[int, tuple[int, ...]]]] = {}  # name -> (call, input seqs)
        self.grad_rows: list[tuple[int, torch.Tensor, int]] = []  # (seq, forward's serial, row)
        self.refused: dict[int, str] = {}  # seq -> why its grad statistics are not recorded

    def start(self) -> None:
        # dynamo makes the ctx of the in-graph grads' autograd Function by instantiating
        # Function in a catch_warnings that does not filter (torch/_dynamo/side_effects.py): its
        # deprecation warning, which torch means to swallow, is an error where warnings are
        warnings.filterwarnings("ignore", DYNAMO_CTX, DeprecationWarning)
        self.graph.take()  # calls of a step recorded before and never taken
        self.graph.grads.take()
        self.graph.grads.begin()
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
        deps of its parameters' grads), the grads of their outputs and inputs after them in
        backward order (``_GradEvent``); those without in-graph statistics in ``not_recordable``."""
        if not self.graph.calls:
            return
        owners: list[_GradEvent] = []  # the grads that own a row (or have none), forward order
        by_row: dict[int, _GradEvent] = {}  # this forward's owner of each row
        for name, kind, entries, (serial, rows, owns) in self.graph.take():
            selected = self.selected(name)
            call = self._forward(records, calls, last_call, step, (name, kind, entries)) if selected else -1
            for i, entry in enumerate(entries):
                if not entry[3]:  # no grad
                    continue
                row, own = (rows[i], owns[i]) if i < len(rows) else (NESTED_ROW, True)
                grad: Kind = "grad_input" if kind == "input" else "grad_output"
                event = _GradEvent(name, call, grad, entry, serial, row, selected and self.grads)
                owner = by_row.get(row) if row >= 0 and not own else None
                if owner is not None:  # the same tensor as an earlier output or rebased input
                    owner.after.append(event)
                    continue
                owners.append(event)
                if row >= 0:
                    by_row[row] = event
        outputs: dict[tuple[str, int], list[int]] = {}  # a call's output grads: its inputs' deps
        for owner in reversed(owners):
            for event in (owner, *owner.after):
                if event.drafted:
                    self._grad_draft(records, last_call, not_recordable, step, event, outputs)

    def _forward(
        self,
        records: list[Record | Draft],
        calls: dict[tuple[str, int], int],
        last_call: dict[str, _Call],
        step: int,
        module_call: tuple[str, str, tuple[Entry, ...]],
    ) -> int:
        """The drafts of one module call's inputs (kind ``input``) or outputs; its call number."""
        name, kind, entries = module_call
        cls, key, open_calls = self.graph.names[name], (name, step), self.open.setdefault(name, [])
        if kind == "input":
            call = calls.get(key, 0)
            calls[key] = call + 1
            seqs = tuple(
                self._draft(records, name, cls, "input", step, call, e, ()) for e in entries if self.inputs
            )
            open_calls.append((call, seqs))
            last_call[name] = _Call(name, cls, call, step, seqs, [])
            return call
        call, seqs = open_calls.pop() if open_calls else (max(calls.get(key, 1) - 1, 0), ())
        for entry in entries:
            self._draft(records, name, cls, "activation", step, call, entry, seqs)
        return call

    def _grad_draft(
        self,
        records: list[Record | Draft],
        last_call: dict[str, _Call],
        not_recordable: dict[str, str],
        step: int,
        event: _GradEvent,
        outputs: dict[tuple[str, int], list[int]],
    ) -> None:
        """The draft of one grad (statistics from the grad sink at the step's end), or why it has
        none in ``not_recordable``; an input's grad depends on its call's output grads."""
        name, call, kind, row = event.name, event.call, event.kind, event.row
        slot, dtype, shape, _, _ = event.entry
        if row < 0:
            why = {PAST: OVERFLOW.format(capacity=self.graph.grads.capacity), ELSE: ELSEWHERE}
            why |= {IS_LEAF: LEAF, IS_VIEW: VIEW, EAGER: NOT_IN_GRAPH}
            not_recordable[record_id(name, kind, slot, step, call)] = why.get(row, NESTED)
            return
        seq, cls = len(records), self.graph.names[name]
        mine = outputs.setdefault((name, call), [])
        deps = tuple(mine) if kind == "grad_input" else ()
        records.append((name, cls, kind, step, call, slot, dtype, shape, deps, None, None, None))
        self.grad_rows.append((seq, event.serial, row))
        if kind == "grad_input":
            return
        mine.append(seq)
        state = last_call.get(name)
        if state is not None and state.call == call:
            state.grad_output_seqs.append(seq)  # the deps of its parameters' grads, as in eager

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
        """The ``Stats`` of the drafts made since the last fetch, by seq, the forward's statistics
        vectors and the backwards' sink grads in one conversion (one host sync per device); the
        grads whose statistics no backward delivered once are in ``refused`` (by seq, why)."""
        vectors, self.vectors = self.vectors, []
        grad_rows, self.grad_rows = self.grad_rows, []
        delivered = self.graph.grads.take() if grad_rows else []
        tensors = [v for _, v in vectors] + [d.flatten() for d in delivered]
        tensors += [serial.reshape(1) for _, serial, _ in grad_rows]
        host = fetch_vectors(tensors) if tensors else []
        fetched: dict[int, tuple[Stats | None, str | None]] = {}
        for (seq, _), stats in zip(vectors, host, strict=False):
            fetched[seq] = (vector_stats(stats, self._shape(records, seq)), None)
        sinks = [
            [d[r : r + WIDTH] for r in range(0, len(d), WIDTH)]
            for d in host[len(vectors) :][: len(delivered)]
        ]
        serials = host[len(vectors) + len(delivered) :]
        for (seq, _, at), serial in zip(grad_rows, serials, strict=True):
            picked = pick_row(sinks, serial[0], at)
            if isinstance(picked, str):
                self.refused[seq] = picked
            else:
                fetched[seq] = (vector_stats(picked, self._shape(records, seq)), None)
        return fetched

    @staticmethod
    def _shape(records: list[Record | Draft], seq: int) -> tuple[int, ...]:
        draft = records[seq]
        assert isinstance(draft, tuple)  # built at this step's end
        return tuple(draft[7])

    def without_refused(
        self, records: tuple[Record, ...], not_recordable: dict[str, str]
    ) -> tuple[Record, ...]:
        """``records`` without the grads in ``refused`` (each listed in ``not_recordable`` with
        why), nor them in other records' deps."""
        if not self.refused:
            return records
        gone = {records[seq].id: why for seq, why in self.refused.items()}
        not_recordable.update(gone)
        return tuple(
            dataclasses.replace(r, deps=tuple(d for d in r.deps if d not in gone))
            if set(r.deps) & gone.keys()
            else r
            for r in records
            if r.id not in gone
        )

    def note(self, recorded_any: bool) -> CompiledNote:
        """The manifest's ``"compiled"`` note; warns when the graph never ran the hooks."""
        note = CompiledNote("in the graph")
        if not self.open and recorded_any:
            note = dataclasses.replace(note, forward=NOT_TRACED)
            warnings.warn(NOT_TRACED, stacklevel=4)
        return note
