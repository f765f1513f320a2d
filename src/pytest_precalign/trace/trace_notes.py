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

A list entry stays a JSON object (its keys are the writer's, read by its own package).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import TraceError

__all__ = ["NOTE_KEYS", "Entry", "TraceNotes", "note_json"]

Entry = Mapping[str, Any]  # one JSON object of a note list


@dataclass(frozen=True)
class TraceNotes:
    """The notes of one trace (each empty when not noted)."""

    steps: tuple[int, ...] = ()
    incomplete_steps: tuple[Entry, ...] = ()
    grads_missing: tuple[Entry, ...] = ()
    replica_mismatches: tuple[Entry, ...] = ()
    not_recordable: Mapping[str, str] = field(default_factory=dict)
    not_trained: str = ""
    dp_split: Mapping[str, str] = field(default_factory=dict)
    dp_join: Mapping[str, Entry] = field(default_factory=dict)
    tp_unmerged: Mapping[str, str] = field(default_factory=dict)
    tp_partials: Mapping[str, Entry] = field(default_factory=dict)
    tp_grad_shards: Mapping[str, Entry] = field(default_factory=dict)
    compiled: Entry | None = None
    param_grads: str | None = None

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], where: str = "manifest") -> TraceNotes:
        """The notes a manifest carries; a ``TraceError`` naming ``where`` and the key for a
        note of the wrong shape."""
        return cls(
            steps=_steps(manifest, where),
            incomplete_steps=_entries(manifest, "incomplete_steps", where),
            grads_missing=_entries(manifest, "grads_missing", where),
            replica_mismatches=_entries(manifest, "replica_mismatches", where),
            not_recordable=_texts(manifest, "not_recordable", where),
            not_trained=str(manifest.get("not_trained") or ""),
            dp_split=_texts(manifest, "dp_split", where),
            dp_join={str(k): v for k, v in _object(manifest, "dp_join", where).items()},
            tp_unmerged=_texts(manifest, "tp_unmerged", where),
            tp_partials={str(k): v for k, v in _object(manifest, "tp_partials", where).items()},
            tp_grad_shards={str(k): v for k, v in _object(manifest, "tp_grad_shards", where).items()},
            compiled=dict(_object(manifest, "compiled", where)) or None,
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
    if isinstance(value, tuple):
        return [dict(v) if isinstance(v, Mapping) else v for v in value] if value else None
    if isinstance(value, Mapping):
        return dict(value) if value else None
    return value if value else None


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


def _entries(manifest: Mapping[str, Any], key: str, where: str) -> tuple[Entry, ...]:
    items = _list(manifest, key, where)
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise TraceError(f"{where}: {key}[{i}] must be a mapping, got {type(item).__name__}")
    return tuple(items)


def _object(manifest: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = manifest.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TraceError(f"{where}: {key!r} must be a mapping, got {type(value).__name__}")
    return value


def _texts(manifest: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _object(manifest, key, where).items()}
