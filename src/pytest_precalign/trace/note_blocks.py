"""The nested blocks of a trace's notes, typed (``trace_notes.TraceNotes`` holds them): each is
parsed once from the manifest (``from_json``: a ``TraceError`` naming the file, the note and the
key for a block of the wrong shape) and written back as the same JSON object (``to_json``: the
writer's keys, in the writer's order). Code outside ``trace/`` reads their attributes.

- ``IncompleteStep``: a step an interrupted run left partial (``parallel.steps``).
- ``MissingGrads``: a step whose parameter grads were all gone at ``stop()`` (the ``Recorder``).
- ``ReplicaMismatch``: a record (or step scalar) the ranks of a merged side disagree on
  (``parallel.merge``, ``parallel.dp_join``, ``parallel.dp_scalars``).
- ``DpJoin`` (with its ``JoinedPart`` rows): how one step's DP replicas were merged
  (``parallel.dp_join``).
- ``TpPartials``: each TP rank's partial sums of a step's ``RowwiseParallel`` outputs, or (the
  ``tp_grad_shards`` note) its local shards of the sharded weights' grads
  (``steps/tp_partials.py``, ``parallel.dtensor_rules``).
- ``CompiledNote``: what a recording under ``torch.compile`` recorded in the graph
  (``recording.compiled_records``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, Self, cast

from ..errors import TraceError
from .json_fields import field_dict, plain

__all__ = [
    "CompiledNote",
    "DpJoin",
    "IncompleteStep",
    "JoinedPart",
    "MissingGrads",
    "PartialSums",
    "ReplicaMismatch",
    "TpPartials",
]

PartialSums = tuple[float, ...] | None  # one call's (max, min, sum, norm); None: NaN or Inf


class _Recorded(Protocol):
    """What a finding names of its record (a ``records.Record``)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def step(self) -> int: ...


class _Fields:
    """The keys of one JSON object of a note (``path`` names it in an error)."""

    def __init__(self, value: Any, where: str, path: str) -> None:
        if not isinstance(value, Mapping):
            raise TraceError(f"{where}: {path} must be a mapping, got {type(value).__name__}")
        self.value, self.where, self.path = value, where, path

    def bad(self, key: str, what: str) -> TraceError:
        got = f"got {self.value[key]!r:.80}" if key in self.value else "it is missing"
        return TraceError(f"{self.where}: {self.path}[{key!r}] must be {what}, {got}")

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.value.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(key, "an integer")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        value = self.value.get(key, default)
        if not isinstance(value, str):
            raise self.bad(key, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return self.text(key) if key in self.value else None

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.value.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.bad(key, "a list of strings")
        return tuple(value)

    def numbers(self, key: str, default: Sequence[float] = ()) -> tuple[float, ...]:
        value = self.value.get(key, list(default))
        if not isinstance(value, list) or not all(_number(v) for v in value):
            raise self.bad(key, "a list of numbers")
        return tuple(value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.value.get(key, {})
        if not isinstance(value, Mapping):
            raise self.bad(key, "a mapping")
        return value

    def text_map(self, key: str) -> dict[str, str]:
        value = self.mapping(key)
        if not all(isinstance(v, str) for v in value.values()):
            raise self.bad(key, "a mapping of strings")
        return {str(k): v for k, v in value.items()}


_STATS = {"max", "min", "mean", "norm"}  # a record's statistics (``records.Stats``)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Flat:
    """A block whose JSON object is its fields, in order (integers, strings, lists of strings)."""

    @classmethod
    def from_json(cls, value: Any, where: str, path: str) -> Self:
        f = _Fields(value, where, path)
        return cls(**{x.name: _READ[str(x.type)](f, x.name) for x in fields(cast(Any, cls))})

    def to_json(self) -> dict[str, Any]:
        return field_dict(self)


_READ: dict[str, Callable[[_Fields, str], Any]] = {
    "int": _Fields.integer,
    "str": _Fields.text,
    "tuple[str, ...]": _Fields.texts,
}


@dataclass(frozen=True)
class IncompleteStep(_Flat):
    """A step an interrupted run left partial: which, and what is missing from it."""

    step: int
    detail: str


@dataclass(frozen=True)
class MissingGrads(_Flat):
    """A step whose parameter grads were all gone at ``stop()`` (a few of their names)."""

    step: int
    rank: int
    count: int
    names: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class ReplicaMismatch(_Flat):
    """A record the ranks of a merged side should hold the same and do not: ``kept`` is the
    rank whose copy was kept, ``differ`` the ranks that recorded other values (``detail``)."""

    record: str
    name: str
    kind: str
    phase: str
    step: int
    kept: str
    differ: tuple[str, ...]
    detail: str

    @classmethod
    def of(cls, rec: _Recorded, kept: str, differ: Sequence[str], detail: str) -> ReplicaMismatch:
        """The finding on record ``rec``: ``differ`` recorded other values than ``kept``."""
        return cls(rec.id, rec.name, rec.kind, rec.phase, rec.step, kept, tuple(differ), detail)


@dataclass(frozen=True)
class JoinedPart:
    """One DP replica's rows of a record joined along the batch: its lead rank folder, its row
    count along ``dim``, and its statistics (scaled by its loss weight; None without)."""

    where: str
    rows: int
    dim: int
    stats: Mapping[str, float] | None

    @classmethod
    def from_json(cls, value: Any, where: str, path: str) -> JoinedPart:
        f = _Fields(value, where, path)
        stats = f.value.get("stats")
        if stats is not None and not (
            isinstance(stats, Mapping) and set(stats) >= _STATS and all(map(_number, stats.values()))
        ):
            raise f.bad("stats", "null or a mapping of numbers with max, min, mean and norm")
        return cls(f.text("where"), f.integer("rows"), f.integer("dim"), stats)

    def to_json(self) -> dict[str, Any]:
        return field_dict(self)


@dataclass(frozen=True)
class DpJoin:
    """How one step's DP replicas were merged: ``joined`` along the batch (they trained on
    different rows; their loss ``weights``, the records joined, those left ``unpaired`` and
    why, each joined record's ``parts``), or checked as copies."""

    replicas: int
    joined: bool
    weights: tuple[float, ...] = ()
    records_joined: int = 0
    unpaired: Mapping[str, str] = field(default_factory=dict)
    parts: Mapping[str, tuple[JoinedPart, ...]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, value: Any, where: str, path: str) -> DpJoin:
        f = _Fields(value, where, path)
        joined = f.value.get("joined")
        if not isinstance(joined, bool):
            raise f.bad("joined", "true or false")
        parts: dict[str, tuple[JoinedPart, ...]] = {}
        for rid, rows in f.mapping("parts").items():
            if not isinstance(rows, list):
                raise f.bad("parts", "a mapping of lists")
            at = f"{path}['parts'][{rid!r}]"
            parts[str(rid)] = tuple(JoinedPart.from_json(p, where, f"{at}[{i}]") for i, p in enumerate(rows))
        return cls(
            replicas=f.integer("replicas"),
            joined=joined,
            weights=f.numbers("weights"),
            records_joined=f.integer("records_joined", 0),
            unpaired=f.text_map("unpaired"),
            parts=parts,
        )

    def to_json(self) -> dict[str, Any]:
        if not self.joined:
            return {"replicas": self.replicas, "joined": False}
        return field_dict(self)


@dataclass(frozen=True)
class TpPartials:
    """One step's partial sums: module -> TP rank (as written, ``"0"``) -> one entry a call."""

    modules: Mapping[str, Mapping[str, tuple[PartialSums, ...]]]

    @classmethod
    def from_json(cls, value: Any, where: str, path: str) -> TpPartials:
        f = _Fields(value, where, path)
        modules: dict[str, dict[str, tuple[PartialSums, ...]]] = {}
        for module in f.value:
            ranks = _Fields(f.value[module], where, f"{path}[{module!r}]")
            modules[str(module)] = {str(rank): _calls(ranks, rank) for rank in ranks.value}
        return cls(modules)

    def of(self, module: str) -> Mapping[str, tuple[PartialSums, ...]] | None:
        """The ranks' partial sums of ``module``; None where no rank kept any."""
        return self.modules.get(module) or None

    def to_json(self) -> dict[str, Any]:
        return {module: plain(ranks) for module, ranks in self.modules.items()}


def _calls(ranks: _Fields, rank: str) -> tuple[PartialSums, ...]:
    calls = ranks.value[rank]
    ok = isinstance(calls, list) and all(
        c is None or isinstance(c, list) and all(map(_number, c)) for c in calls
    )
    if not ok:
        raise ranks.bad(rank, "a list of [max, min, sum, norm] lists (or null)")
    return tuple(None if c is None else tuple(c) for c in calls)


@dataclass(frozen=True)
class CompiledNote:
    """What a recording under ``torch.compile`` recorded: its statistics ``"in the graph"`` or
    ``"outside the graph"`` (with a ``note`` why), what it could ``not_record`` there and why,
    and a ``forward`` warning when the graph never ran the hooks."""

    stats: str
    note: str | None = None
    not_recorded: Mapping[str, str] | None = None
    forward: str | None = None

    @classmethod
    def from_json(cls, value: Any, where: str, path: str) -> CompiledNote:
        f = _Fields(value, where, path)
        not_recorded = f.text_map("not_recorded") if "not_recorded" in f.value else None
        return cls(f.text("stats"), f.optional_text("note"), not_recorded, f.optional_text("forward"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stats": self.stats}
        if self.note is not None:
            out["note"] = self.note
        if self.not_recorded is not None:
            out["not_recorded"] = dict(self.not_recorded)
        if self.forward is not None:
            out["forward"] = self.forward
        return out
