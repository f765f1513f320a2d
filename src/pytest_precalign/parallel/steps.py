"""Several steps of a merged run as one trace (records in step order, every step's scalars,
the run's settings), and the steps a run interrupted mid-step left partial (compared without
them; the verdict says which)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..trace.note_blocks import IncompleteStep
from ..trace.records import Record, Trace
from ..trace.step_markers import IN_STEP_SUFFIX, stopped_inside
from ..trace.step_scalars import StepScalars
from ..trace.training_record import INITIAL_PARAMS_KEY, TRAINING_KEY, RunRecord
from ..trace.write_failures import read_write_failure_note
from .store import MergedTensors, Plan


def combine_steps(
    steps: Sequence[tuple[int, Trace]], root: Path, sources: Mapping[int, str] | None = None
) -> Trace:
    """Merged traces of several steps -> one multi-step run (records in step order). Steps
    recorded as scalars only (no records) are steps of the run too: every step's scalars are
    merged (a step's scalars held twice with other values is an error naming both files),
    the run's settings and initial parameters come from the step that carries them (step 0),
    and the manifest's other keys from the first step with records. ``sources``: where each
    step's manifest was read (for messages); ``step<N>/`` of ``root`` when not given."""
    where = {step: (sources or {}).get(step, str(root / f"step{step}")) for step, _ in steps}
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
    first = next((trace for _, trace in steps if trace.records), steps[0][1])
    notes = [t.notes for _, t in steps]
    combined = Trace(first.manifest, tuple(records), MergedTensors(plans), first.run).with_run(
        _run_record(steps, where)
    )
    combined = combined.with_notes(
        steps=tuple(s for s, _ in steps),
        replica_mismatches=tuple(m for n in notes for m in n.replica_mismatches),
        grads_missing=tuple(m for n in notes for m in n.grads_missing),
        dp_join={k: v for n in notes for k, v in n.dp_join.items()},
        tp_unmerged={k: v for n in notes for k, v in n.tp_unmerged.items()},
        tp_partials={k: v for n in notes for k, v in n.tp_partials.items()},
        tp_grad_shards={k: v for n in notes for k, v in n.tp_grad_shards.items()},
    )
    return _with_path(combined, root)


def _run_record(steps: Sequence[tuple[int, Trace]], where: Mapping[int, str]) -> RunRecord:
    """The run record of several steps' traces: every step's scalars, merged; the settings
    and initial parameters of the first step that carries them."""
    scalars: dict[int, StepScalars] = {}
    held: dict[int, int] = {}  # step of the scalars -> step folder they were read from
    out: dict[str, Any] = {}
    first: dict[str, int] = {}  # key -> the step folder that holds it
    for step, trace in steps:
        run = trace.run
        for key, part in ((TRAINING_KEY, run.settings), (INITIAL_PARAMS_KEY, run.initial_params)):
            if part is None:
                continue
            if key not in out:
                out[key], first[key] = part, step
            elif part != out[key]:
                raise TraceError(
                    f"{where[step]}: a second '{key}' block, not the one of {where[first[key]]}: a run "
                    "root holds one run's (two runs in one folder?)"
                )
        for at, value in run.scalars.items():
            if at in scalars and scalars[at] != value:
                raise TraceError(
                    f"the scalars of step {at} differ between {where[held[at]]} and {where[step]}: "
                    "a run's step is recorded once (two runs in one folder?)"
                )
            scalars[at], held[at] = value, step
    return RunRecord(out.get(TRAINING_KEY), scalars, out.get(INITIAL_PARAMS_KEY))


def _with_path(trace: Trace, root: Path) -> Trace:
    return replace(trace, manifest={**trace.manifest, "path": str(root)}, given_notes=trace.notes)


def split_incomplete(
    root: Path, found: Mapping[int, Mapping[int, Path]]
) -> tuple[dict[int, Mapping[int, Path]], list[IncompleteStep]]:
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
        IncompleteStep(step, _missing(root / f"step{step}", sorted(world - set(ranks))))
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
        elif stopped_inside(folder / f"rank{rank}"):
            parts.append(
                f"rank{rank}/ was begun and never finished: killed or crashed (its marker "
                f".rank{rank}{IN_STEP_SUFFIX} is there)"
            )
        else:
            parts.append(f"rank{rank}/ is missing")
    told = f"{folder.parent}: {folder.name}/ is incomplete ({'; '.join(parts)})"
    if any(stopped_inside(folder / f"rank{rank}") for rank in ranks):
        told += f": the run stopped inside step {folder.name[4:]}"
    return told


def interrupted_steps(root: Path) -> list[str]:
    """``step<N>/`` folders of ``root`` holding nothing but writers' temporary folders (and
    the markers of steps that began, ``trace.step_markers``)."""
    try:
        steps = sorted(p for p in root.glob("step*") if p.is_dir())
        return [
            p.name
            for p in steps
            if (kids := list(p.iterdir())) and all(k.name.endswith((".tmp", IN_STEP_SUFFIX)) for k in kids)
        ]
    except OSError:
        return []
