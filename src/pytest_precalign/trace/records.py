"""The trace: what a recorder saw, in execution order. Pure data, no torch import.

A ``Trace`` is a manifest (environment and settings, as written on disk), a tuple of
``Record`` s in execution order, a tensor store (key -> tensor) that is a dict in memory or a
lazy reader on disk (see ``native_io``), and the two typed parts of its manifest: ``run``
(``training_record.RunRecord``: settings, plan, step scalars, initial parameters) and ``notes``
(``trace_notes.TraceNotes``). ``run`` is given at construction by whoever builds the trace: the
loaders read it (``read_run_record``, the only parse of it), every other builder holds it typed
(the recorder, a merge, a trace made from another one's); a trace whose manifest carries run
keys but which is given no run is refused (``TraceError``), so ``Trace.run`` never parses.
``notes`` are held from construction too: a loader gives the notes it read (``notes=``, its
errors naming the file); any other trace reads them from its manifest when it is made (a note of
the wrong shape is a ``TraceError`` there, never at a later use). A change goes through
``with_notes`` / ``with_run``, which keep the manifest and the typed parts together;
``with_records`` keeps both.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import InitVar, dataclass, field, replace
from typing import Any

from ..errors import TraceError
from ..vocabulary import PHASE_OF_KIND, Kind, Phase, as_kind, as_phase
from .arrays import as_numpy
from .json_fields import field_dict
from .step_scalars import StepScalars
from .trace_notes import TraceNotes, note_json
from .training_record import NO_RUN, RUN_RECORD_KEYS, RunRecord

__all__ = ["PHASE_OF_KIND", "Record", "Stats", "TensorOverlay", "Trace", "is_training_run", "record_id"]


@dataclass(frozen=True)
class Stats:
    max: float
    min: float
    mean: float
    norm: float
    nan: int = 0
    inf: int = 0

    @property
    def finite(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def as_dict(self) -> dict[str, float | int]:
        return field_dict(self)


@dataclass(frozen=True)
class Record:
    """One tensor seen during a run."""

    seq: int
    name: str  # module path, or full parameter name for param / param_grad
    module_class: str
    phase: Phase
    step: int
    call: int
    kind: Kind
    slot: str  # which tensor of the module's inputs/outputs: "out", "out.0", "in.hidden_states"
    dtype: str
    shape: tuple[int, ...]
    stats: Stats | None = None
    crc32: str | None = None
    tensor_key: str | None = None
    deps: tuple[str, ...] = ()  # ids of the records this one was computed from
    # The names of the records whose statistics were merged into this one (``merged_stats``):
    # the parts of a tensor the other side fuses. Empty for a recorded tensor.
    merged: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return record_id(self.name, self.kind, self.slot, self.step, self.call)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def renamed(self, name: str, deps: tuple[str, ...]) -> Record:
        return replace(self, name=name, deps=deps)

    def as_dict(self) -> dict[str, Any]:
        return field_dict(self, omit_empty=("merged",))


def record_id(name: str, kind: str, slot: str, step: int, call: int) -> str:
    return f"{name}|{kind}|{slot}|{step}|{call}"


def record_from_dict(data: Mapping[str, Any]) -> Record:
    stats = data.get("stats")
    return Record(
        seq=int(data["seq"]),
        name=str(data["name"]),
        module_class=str(data["module_class"]),
        phase=as_phase(data["phase"]),
        step=int(data["step"]),
        call=int(data["call"]),
        kind=as_kind(data["kind"]),
        slot=str(data["slot"]),
        dtype=str(data["dtype"]),
        shape=tuple(int(d) for d in data["shape"]),
        stats=Stats(**stats) if stats else None,
        crc32=data.get("crc32"),
        tensor_key=data.get("tensor_key"),
        deps=tuple(data.get("deps", ())),
        merged=tuple(data.get("merged", ())),
    )


@dataclass(frozen=True)
class Trace:
    manifest: Mapping[str, Any]
    records: tuple[Record, ...]
    tensors: Mapping[str, Any] = field(default_factory=dict)  # key -> torch.Tensor
    # The training run's record (``training_record``), typed, as the manifest's run keys say:
    # given by the builder (see the module doc), never parsed here.
    run: RunRecord = field(default=NO_RUN, repr=False, compare=False)
    # The notes as read by the trace's maker (a loader, naming its file in any error); when not
    # given, read from the manifest here. Never copied by ``replace``: a trace made with another
    # manifest reads its own.
    given_notes: InitVar[TraceNotes | None] = None
    _notes: TraceNotes = field(init=False, repr=False, compare=False)

    def __post_init__(self, given_notes: TraceNotes | None) -> None:
        notes = TraceNotes.from_manifest(self.manifest) if given_notes is None else given_notes
        object.__setattr__(self, "_notes", notes)
        if self.run.is_empty and any(self.manifest.get(key) is not None for key in RUN_RECORD_KEYS):
            keys = [key for key in RUN_RECORD_KEYS if self.manifest.get(key) is not None]
            raise TraceError(
                f"a trace whose manifest carries {keys} was built without its run record: pass "
                "run= (a loader reads it with read_run_record; a trace made from another passes its run)"
            )

    @property
    def notes(self) -> TraceNotes:
        """What the recorder, a merge or the contract check noted (``trace_notes``)."""
        return self._notes

    def with_notes(self, **changes: Any) -> Trace:
        """This trace with notes changed (an empty note is dropped from the manifest)."""
        notes = replace(self.notes, **changes)
        manifest = dict(self.manifest)
        for key in changes:
            value = note_json(notes, key)
            if value is None:
                manifest.pop(key, None)
            else:
                manifest[key] = value
        return replace(self, manifest=manifest, given_notes=notes)

    def with_run(self, run: RunRecord) -> Trace:
        """This trace holding ``run`` as its run record (its manifest's keys rewritten)."""
        manifest = {k: v for k, v in self.manifest.items() if k not in RUN_RECORD_KEYS}
        manifest |= run.manifest_keys()
        return replace(self, manifest=manifest, run=run, given_notes=self._notes)

    def with_records(self, records: tuple[Record, ...], tensors: Mapping[str, Any] | None = None) -> Trace:
        """This trace with other records (and tensors), its manifest and typed parts kept."""
        tensors = self.tensors if tensors is None else tensors
        return replace(self, records=records, tensors=tensors, given_notes=self._notes)

    @property
    def mode(self) -> str:
        return str(self.manifest.get("record_mode", "stats"))

    @property
    def scalars(self) -> Mapping[int, StepScalars]:
        """What each training step did (loss, LR, grad norm ...), by step; empty when the
        trace carries none (``step_scalars``)."""
        return self.run.scalars

    def tensor(self, record: Record) -> Any:
        if record.tensor_key is None:
            return None
        return self.tensors.get(record.tensor_key)

    def has_tensor(self, record: Record) -> bool:
        return record.tensor_key is not None and record.tensor_key in self.tensors

    def array(self, record: Record) -> Any:
        """The record's tensor as a numpy array (``None`` when not kept). Stores read from
        disk answer without torch (their ``array`` method)."""
        key = record.tensor_key
        if key is None or key not in self.tensors:
            return None
        reader = getattr(self.tensors, "array", None)
        return reader(key) if reader is not None else as_numpy(self.tensors[key])

    def raw_array(self, record: Record) -> tuple[Any, bool]:
        """``(array, raw)``: as ``array``, except that a bfloat16 tensor read from disk comes as
        its uint16 bit patterns (``raw`` True), for the compare to widen a chunk at a time (no
        float32 copy of the whole tensor). Stores that can do so say ``raw_bf16_arrays``."""
        key = record.tensor_key
        if key is None or key not in self.tensors or not getattr(self.tensors, "raw_bf16_arrays", False):
            return self.array(record), False
        reader: Any = self.tensors  # a store that reads from disk (``raw_bf16_arrays``)
        found = reader.array(key, raw_bf16=True)
        return found, record.dtype == "bfloat16" and str(found.dtype) == "uint16"

    def by_id(self) -> dict[str, Record]:
        return {r.id: r for r in self.records}


class TensorOverlay(Mapping[str, Any]):
    """New tensors over a (possibly lazy, on-disk) store, without loading the store."""

    def __init__(self, base: Mapping[str, Any], extra: dict[str, Any] | None = None) -> None:
        self._base = base
        self._extra = extra if extra is not None else {}

    def __setitem__(self, key: str, value: Any) -> None:
        self._extra[key] = value

    def __getitem__(self, key: str) -> Any:
        if key in self._extra:
            return self._extra[key]
        return self._base[key]

    @property
    def raw_bf16_arrays(self) -> bool:
        return bool(getattr(self._base, "raw_bf16_arrays", False))

    def array(self, key: str, raw_bf16: bool = False) -> Any:
        if key in self._extra:
            return as_numpy(self._extra[key])
        reader = getattr(self._base, "array", None)
        if reader is None:
            return as_numpy(self._base[key])
        return reader(key, raw_bf16=True) if raw_bf16 and self.raw_bf16_arrays else reader(key)

    def __contains__(self, key: object) -> bool:
        return key in self._extra or key in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._extra
        yield from (k for k in self._base if k not in self._extra)

    def __len__(self) -> int:
        return len(self._extra) + sum(1 for k in self._base if k not in self._extra)


# torch's dtype names (without ``torch.``), kept here so that reading a trace needs no torch.
DTYPE_NAMES = frozenset(
    [
        "bfloat16",
        "bit",
        "bits16",
        "bits1x8",
        "bits2x4",
        "bits4x2",
        "bits8",
        "bool",
        "cdouble",
        "cfloat",
        "chalf",
        "complex128",
        "complex32",
        "complex64",
        "double",
        "float",
        "float16",
        "float32",
        "float4_e2m1fn_x2",
        "float64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "half",
        "int",
        "int1",
        "int16",
        "int2",
        "int3",
        "int32",
        "int4",
        "int5",
        "int6",
        "int64",
        "int7",
        "int8",
        "long",
        "qint32",
        "qint8",
        "quint2x4",
        "quint4x2",
        "quint8",
        "short",
        "uint1",
        "uint16",
        "uint2",
        "uint3",
        "uint32",
        "uint4",
        "uint5",
        "uint6",
        "uint64",
        "uint7",
        "uint8",
    ]
)


def is_dtype_name(name: Any) -> bool:
    """``float32``, ``bfloat16``, ... (as torch names its dtypes, without ``torch.``)."""
    return isinstance(name, str) and name in DTYPE_NAMES


def is_training_run(baseline: Trace, candidate: Trace) -> bool:
    """Two traces of a training run: scalars or a plan on either side, or records of more
    than one optimizer step."""
    if baseline.run.is_training or candidate.run.is_training:
        return True
    steps = {r.step for r in baseline.records if r.kind == "param"}
    return len(steps) > 1
