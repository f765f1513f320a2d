"""What a recorder, a merge or the contract check noted about a trace (``TraceNotes``): the
only reader and writer of the manifest's note keys. Code outside ``trace/`` reads
``trace.notes.<name>`` and adds a note with ``trace.with_notes(name=...)``, never a manifest key.

The JSON layout (each key absent when its note is empty)::

    {"steps": [0, 1, 2],                      # the steps a merged root recorded (parallel.steps)
     "incomplete_steps": [{"step": 3, ...}],  # steps an interrupted run left partial
     "grads_missing": [{"step": 1, "rank": 0, "count": 4, "names": [...], "why": "..."}],
     "replica_mismatches": [{"step": 0, "name": ..., "kind": ..., "differ": [...], ...}],
     "not_recordable": {"<record id>": "why its grad cannot be recorded"},
     "not_trained": "why the case stopped before step 0",  # run.contract_check
     "dp_split": {"<step>": "why its DP replicas' rows differ"},
     "dp_join": {"<step>": {"joined": true, ...}},   # parallel.dp_join
     "tp_unmerged": {"<record id>": "why its TP ranks are not merged"},  # parallel.dtensor_rules
     "tp_partials": {"<step>": {"<module>": {"<rank>": [[max, min, sum, norm], ...]}}},  # steps.tp_partials
     "tp_grad_shards": {"<step>": {"<param>": {"<rank>": [[max, min, sum, norm], ...]}}},  # the same
     "compiled": {"stats": "in the graph", ...},     # recording.compiled_records
     "param_grads": "step"}                          # the Recorder's param_grads setting

Each nested block is typed (``note_blocks``: parsed here, written back as the same JSON object).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ..errors import TraceError
from .note_blocks import CompiledNote, DpJoin, IncompleteStep, MissingGrads, ReplicaMismatch, TpPartials

__all__ = ["NOTE_KEYS", "TraceNotes", "note_json"]

_Block = TypeVar("_Block")


@dataclass(frozen=True)
class TraceNotes:
    """The notes of one trace (each empty when not noted)."""

    steps: tuple[int, ...] = ()
    incomplete_steps: tuple[IncompleteStep, ...] = ()
    grads_missing: tuple[MissingGrads, ...] = ()
    replica_mismatches: tuple[ReplicaMismatch, ...] = ()
    not_recordable: Mapping[str, str] = field(default_factory=dict)
    not_trained: str = ""
    dp_split: Mapping[str, str] = field(default_factory=dict)
    dp_join: Mapping[str, DpJoin] = field(default_factory=dict)
    tp_unmerged: Mapping[str, str] = field(default_factory=dict)
    tp_partials: Mapping[str, TpPartials] = field(default_factory=dict)
    tp_grad_shards: Mapping[str, TpPartials] = field(default_factory=dict)  # param -> rank -> calls
    compiled: CompiledNote | None = None
    param_grads: str | None = None

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], where: str = "manifest") -> TraceNotes:
        """The notes a manifest carries; a ``TraceError`` naming ``where`` and the key for a
        note of the wrong shape."""
        return cls(
            steps=_steps(manifest, where),
            incomplete_steps=_entries(manifest, "incomplete_steps", where, IncompleteStep.from_json),
            grads_missing=_entries(manifest, "grads_missing", where, MissingGrads.from_json),
            replica_mismatches=_entries(manifest, "replica_mismatches", where, ReplicaMismatch.from_json),
            not_recordable=_texts(manifest, "not_recordable", where),
            not_trained=str(manifest.get("not_trained") or ""),
            dp_split=_texts(manifest, "dp_split", where),
            dp_join=_blocks(manifest, "dp_join", where, DpJoin.from_json),
            tp_unmerged=_texts(manifest, "tp_unmerged", where),
            tp_partials=_blocks(manifest, "tp_partials", where, TpPartials.from_json),
            tp_grad_shards=_blocks(manifest, "tp_grad_shards", where, TpPartials.from_json),
            compiled=_compiled(manifest, where),
            param_grads=None if manifest.get("param_grads") is None else str(manifest["param_grads"]),
        )

    def to_manifest(self) -> dict[str, Any]:
        """The manifest keys of the notes that are not empty (JSON-safe)."""
        values = {key: note_json(self, key) for key in NOTE_KEYS}
        return {key: value for key, value in values.items() if value is not None}


NOTE_KEYS = tuple(f.name for f in fields(TraceNotes))


def note_json(notes: TraceNotes, key: str) -> Any:
    """The manifest value of note ``key``; None when the note is empty (no key is written)."""
    value = getattr(notes, key)
    if not value:
        return None
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return _json(value)


def _json(value: Any) -> Any:
    """A note's value as JSON: a typed block as its object (``note_blocks``), else itself."""
    to_json = getattr(value, "to_json", None)
    return to_json() if to_json is not None else value


def _steps(manifest: Mapping[str, Any], where: str) -> tuple[int, ...]:
    steps = _list(manifest, "steps", where)
    for i, step in enumerate(steps):
        if isinstance(step, bool) or not isinstance(step, int):
            raise TraceError(f"{where}: steps[{i}] must be a step number, got {step!r:.80}")
    return tuple(steps)


def _list(manifest: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = manifest.get(key)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise TraceError(f"{where}: {key!r} must be a list, got {type(value).__name__}")
    return list(value)


def _entries(
    manifest: Mapping[str, Any], key: str, where: str, parse: Callable[[Any, str, str], _Block]
) -> tuple[_Block, ...]:
    return tuple(parse(item, where, f"{key}[{i}]") for i, item in enumerate(_list(manifest, key, where)))


def _blocks(
    manifest: Mapping[str, Any], key: str, where: str, parse: Callable[[Any, str, str], _Block]
) -> dict[str, _Block]:
    return {str(k): parse(v, where, f"{key}[{str(k)!r}]") for k, v in _object(manifest, key, where).items()}


def _compiled(manifest: Mapping[str, Any], where: str) -> CompiledNote | None:
    block = _object(manifest, "compiled", where)
    return CompiledNote.from_json(block, where, "compiled") if block else None


def _object(manifest: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = manifest.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TraceError(f"{where}: {key!r} must be a mapping, got {type(value).__name__}")
    return value


def _texts(manifest: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _object(manifest, key, where).items()}
