"""Several steps of a merged run as one trace (records in step order)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import TraceError
from ..trace.records import Record, Trace
from .store import MergedTensors, Plan


def combine_steps(steps: Sequence[tuple[int, Trace]], root: Path) -> Trace:
    """Merged traces of several steps -> one trace (records in step order)."""
    if len(steps) == 1:
        return _with_path(steps[0][1], root)
    records: list[Record] = []
    plans: dict[str, Plan] = {}
    owner: dict[str, int] = {}
    for step, trace in steps:
        for rec in trace.records:
            if rec.id in owner:
                raise TraceError(
                    f"{root}: step{owner[rec.id]}/ and step{step}/ both hold record {rec.id!r}; "
                    "each step folder must hold the records of its own step"
                )
            owner[rec.id] = step
            records.append(replace(rec, seq=len(records)))
        store = trace.tensors
        if isinstance(store, MergedTensors):
            plans.update({k: store.plan(k) for k in store})
    manifest = dict(steps[0][1].manifest)
    manifest["steps"] = [s for s, _ in steps]
    mismatches = [m for _, t in steps for m in t.manifest.get("replica_mismatches", ())]
    if mismatches:
        manifest["replica_mismatches"] = mismatches
    missing = [m for _, t in steps for m in t.manifest.get("grads_missing", ())]
    if missing:
        manifest["grads_missing"] = missing
    return _with_path(Trace(manifest, tuple(records), MergedTensors(plans)), root)


def _with_path(trace: Trace, root: Path) -> Trace:
    return replace(trace, manifest={**trace.manifest, "path": str(root)})
