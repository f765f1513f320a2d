"""Several steps of a merged run as one trace (records in step order), and the steps a run
interrupted mid-step left partial (compared without them; the verdict says which)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..trace.records import Record, Trace
from ..trace.write_failures import read_write_failure_note
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


def split_incomplete(
    root: Path, found: Mapping[int, Mapping[int, Path]]
) -> tuple[dict[int, Mapping[int, Path]], list[dict[str, Any]]]:
    """A run root's steps -> (complete steps, what is missing from the others). A step is
    incomplete when it lacks a rank folder another step has: a run killed mid-step leaves
    ``step<N>/`` holding the writer's temporary folder only. One step alone, or no complete
    step at all, is not split: that folder's own errors say what is wrong."""
    if len(found) < 2:
        return dict(found), []
    world = set().union(*(set(ranks) for ranks in found.values()))
    complete = {step: ranks for step, ranks in found.items() if set(ranks) == world}
    if not complete:
        return dict(found), []
    incomplete = [
        {"step": step, "detail": _missing(root / f"step{step}", sorted(world - set(ranks)))}
        for step, ranks in found.items()
        if step not in complete
    ]
    return complete, incomplete


def _missing(folder: Path, ranks: list[int]) -> str:
    parts = []
    for rank in ranks:
        temp = sorted(p.name for p in folder.glob(f".rank{rank}.*.tmp"))
        failed = read_write_failure_note(folder / f"rank{rank}")
        if failed:
            parts.append(f"rank{rank}/ was not written: the Recorder could not write it: {failed}")
        elif temp:
            parts.append(
                f"rank{rank}/ was never published: the writer's temporary folder {temp[0]} is there, "
                "the run was interrupted mid-step"
            )
        elif failed is not None:
            parts.append(
                f"rank{rank}/ was not written: the Recorder could not write it (no reason recorded: a full disk?)"
            )
        else:
            parts.append(f"rank{rank}/ is missing")
    return f"{folder.parent}: {folder.name}/ is incomplete ({'; '.join(parts)})"


def interrupted_steps(root: Path) -> list[str]:
    """``step<N>/`` folders of ``root`` holding nothing but writers' temporary folders."""
    try:
        steps = sorted(p for p in root.glob("step*") if p.is_dir())
        return [
            p.name
            for p in steps
            if (kids := list(p.iterdir())) and all(k.name.endswith(".tmp") for k in kids)
        ]
    except OSError:
        return []
