"""The capture core of ``HookRecorder``: one tensor read into a record, as the mode says.

``capture`` reads a tensor (an identical tensor object seen before is not read again) into a
draft record; the step's statistics and hashes are computed as device tensors and fetched
together when the step ends (``_flush``: one host synchronisation per device, see
``step_buffer.py``), when each draft becomes a ``Record`` (``record_factory``). A CPU tensor's
statistics are read at capture into ``stats_slots``; a DTensor's local shard's combined over
its mesh at the step's end (``sharded_stats``); tensor mode keeps a host copy (``kept_tensors``,
or a background writer); live compare judges each record at capture (``live_golden``).

The hooks that call it are ``hook_callbacks``'s and ``param_records``'s; ``recorder`` puts
them on the model.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, cast

import torch

from ..trace.records import Record, Stats, record_id
from ..vocabulary import Kind
from . import step_buffer
from .calls import _Call
from .kept_tensors import KeptTensors
from .live_golden import LiveKeeper
from .record_factory import Draft, build_drafts, record_now
from .sharded import is_dtensor, plain
from .sharded_stats import ShardedStats
from .stats_slots import StatsSlots
from .step_buffer import StepBuffer
from .tensor_summary import summarisable

if TYPE_CHECKING:
    from .compiled_records import CompiledRecords
    from .live_golden import Judge
    from .tensor_sink import TensorSink


class TensorCapture:
    """What a ``HookRecorder`` step recorded, and the one way a tensor becomes a record."""

    _graph: CompiledRecords | None = None  # under torch.compile, stats mode: set at enter

    def __init__(self, mode: str, golden: Judge | None, sink: TensorSink | None) -> None:
        self.mode = mode
        self._busy = False  # the recorder's own torch calls are not ops of the model
        self._active = False
        self._buffer = StepBuffer()  # this step's statistics / hashes, fetched at its end
        self._pending: dict[int, tuple[int | None, int | None]] = {}  # seq -> (stats, crc) handles
        self._step = 0
        self._records: list[Record | Draft] = []  # by seq; a Draft until its step ends (``_flush``)
        self._built = 0  # the records before this seq are Records
        self._tensors: dict[str, torch.Tensor] = {}
        self._kept = KeptTensors(self._tensors, sink)  # tensor mode: in the trace, or to ``sink``
        self._seen: dict[int, tuple[weakref.ref[torch.Tensor], int, int]] = {}  # id -> (ref, version, seq)
        self._calls: dict[tuple[str, int], int] = {}  # (module, step) -> its calls so far
        self._last_call: dict[str, _Call] = {}  # a module's last call (a param grad's deps)
        self._not_recordable: dict[str, str] = {}  # record id -> why its grad cannot be recorded
        # Stats mode: a CPU tensor's statistics read at capture into a slot (``stats_slots.py``);
        # a DTensor's local shard's, combined over its mesh at the step's end (``sharded_stats.py``).
        self._slots = StatsSlots() if mode == "stats" and golden is None else None
        self._read_cpu = None if self._slots is None else self._slots.read
        self._sharded = None if self._slots is None else ShardedStats()
        self._at_capture = step_buffer.read_at_capture
        built = cast(list[Record], self._records)  # live compare: see live_golden.py
        self._live = None if golden is None else LiveKeeper(golden, built, self._tensors)

    @property
    def step(self) -> int:
        """The step being recorded; setting another value ends the step (one host sync)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        if value != self._step:
            self._flush()
            if self._live is not None:
                self._live.end_step()
        self._step = value

    def _flush(self) -> None:
        """The step's end: the pending statistics and CRCs (one host sync per device), and the
        ``Record`` of each draft, built in one loop (``record_factory.build_drafts``)."""
        self._drain_in_graph()
        pending, self._pending = self._pending, {}
        fetched: dict[int, tuple[Stats | None, str | None]] = {}
        if self._graph is not None:  # one host sync per device
            fetched.update(self._graph.fetch(self._records))
        if pending:
            stats, crcs = self._buffer.flush()
            for seq, (sh, ch) in pending.items():  # hash mode: no stats unless NaN/Inf evidence
                fetched[seq] = (None if sh is None else stats[sh], None if ch is None else crcs[ch])
        if self._sharded is not None:
            fetched.update(self._sharded.combine(self._step))
        slots = self._slots
        build_drafts(self._records, self._built, fetched, None if slots is None else slots.stats)
        self._built = len(self._records)
        if slots is not None:
            slots.clear()

    # -- capture ----------------------------------------------------------------------
    def capture(
        self,
        tensor: torch.Tensor,
        *,
        name: str,
        module_class: str,
        kind: Kind,
        slot: str,
        call: int = 0,
        deps: tuple[str, ...] = (),
        step: int | None = None,
    ) -> Record:
        """Record one tensor (an identical tensor object seen before is not read again); its
        ``Record`` as known now (statistics fetched at the step's end are not in it yet)."""
        self._drain_in_graph()  # under compile: the forward's records come first
        return self._record_now(self._capture(tensor, name, module_class, kind, slot, call, deps, step))

    def _capture(
        self,
        tensor: torch.Tensor,
        name: str,
        module_class: str,
        kind: Kind,
        slot: str,
        call: int,
        deps: tuple[str | int, ...],
        step: int | None,
    ) -> int:
        """``capture``, its record kept as a draft until the step ends: its seq."""
        step = self._step if step is None else step
        records = self._records
        seq = len(records)
        summary: int | Stats | None
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter
            version = -1
        seen = self._seen.get(id(tensor))
        same_as: int | None = None
        if seen is not None and seen[0]() is tensor and seen[1] == version:
            same_as = seen[2]
            earlier = records[same_as]
            if isinstance(earlier, Record):
                summary, crc, key = earlier.stats, earlier.crc32, earlier.tensor_key
            else:
                summary, crc, key = earlier[9:]
            self._share_pending(seq, same_as)
        else:
            busy, self._busy = self._busy, True
            try:
                data = self._readable(tensor, seq, name, kind, slot, step, call)
                if data is None:
                    summary, crc, key = None, None, None
                elif self._read_cpu is not None and self._at_capture(data):
                    summary, crc, key = self._read_cpu(data), None, None
                else:
                    rid = record_id(name, kind, slot, step, call) if self._live is not None else ""
                    summary, crc, key = self._summarize(data.detach(), seq, rid)
            finally:
                self._busy = busy
        records.append(
            (name, module_class, kind, step, call, slot, tensor.dtype, tensor.shape, deps, summary, crc, key)
        )
        self._seen[id(tensor)] = (weakref.ref(tensor), version, seq)
        if self._live is not None:
            self._decide_live(seq, tensor, same_as)
        return seq

    def _decide_live(self, seq: int, tensor: torch.Tensor, same_as: int | None) -> None:
        """Live compare judges record ``seq`` now (may keep its tensor: a subclass as the plain
        tensor it stands for, a DTensor gathered again)."""
        assert self._live is not None
        record = self._records[seq] = self._record_now(seq)
        busy, self._busy = self._busy, True
        try:
            self._live.decide(seq, tensor if plain(tensor) else summarisable(tensor, record.id), same_as)
        finally:
            self._busy = busy

    def _share_pending(self, seq: int, same_as: int) -> None:
        """Record ``seq`` is tensor ``same_as`` read again: it gets that one's pending values."""
        if same_as in self._pending:
            self._pending[seq] = self._pending[same_as]
        if self._sharded is not None and same_as in self._sharded:
            self._sharded.alias(seq, same_as)

    def _readable(
        self, tensor: torch.Tensor, seq: int, name: str, kind: Kind, slot: str, step: int, call: int
    ) -> torch.Tensor | None:
        """The tensor to summarise: a plain dense one as it is; a sparse, meta or nested tensor
        or a tensor subclass as ``summarisable`` makes it (a DTensor's full tensor, gathered);
        None for a DTensor in stats mode, whose local shard is read now and whose ``Stats`` are
        combined over its mesh at the step's end (``sharded_stats.py``)."""
        if plain(tensor) and tensor.layout is torch.strided and not tensor.is_meta and not tensor.is_nested:
            return tensor
        rid = record_id(name, kind, slot, step, call)
        if self._sharded is not None and not tensor.is_meta and is_dtensor(tensor):
            self._sharded.add(seq, tensor, rid)
            return None
        return summarisable(tensor, rid)

    def _record_now(self, seq: int) -> Record:
        """Record ``seq``: built already, or built from its draft as known now (not kept)."""
        return record_now(self._records, seq, None if self._slots is None else self._slots.stats)

    def _summarize(
        self, data: torch.Tensor, seq: int, rid: str
    ) -> tuple[Stats | None, str | None, str | None]:
        """(stats, crc, tensor key) of a tensor not seen before and not read at capture, as the
        mode says; stats and hash modes queue it for the step's end (``_flush``). ``rid``: the
        record's id, for live compare only (not built otherwise: this runs for every record).
        Called by ``capture`` only, inside its busy section (its torch calls are not ops)."""
        if self._live is not None:  # one host sync per record: see live_golden.py
            return (*self._live.summarize(data, rid, crc=self.mode == "hash"), None)
        if self.mode == "stats":
            self._pending[seq] = (self._buffer.add_stats(data), None)
        elif self.mode == "hash":
            # NaN/Inf evidence: statistics, at the step's end, of a float tensor whose
            # sum is not finite; hashes are still compared.
            sh = self._buffer.add_evidence(data) if data.is_floating_point() else None
            self._pending[seq] = (sh, self._buffer.add_crc(data))
        else:  # tensor mode: the stats of the copy when the trace is taken, or queued now
            key = f"t{seq:07d}"
            later = self._kept.keep(key, data)
            self._pending[seq] = (None if later else self._buffer.add_stats(data), None)
            return None, None, key
        return None, None, None

    def _drain_in_graph(self) -> None:
        """Under compile: the module calls the compiled graph recorded, as drafts (``compiled_records``)."""
        if self._graph is not None:
            self._graph.drain(self._records, self._calls, self._last_call, self._not_recordable, self._step)
