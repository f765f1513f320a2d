"""A run recorded in parts read as one run: a root whose manifests point to the run's first
part (a run resumed into a new root, ``trace.run_parts``) is joined with it, the steps up to
the pointer's ``step`` from the first part, the rest from the new root, and so on along the
chain. Refused, naming both roots and the fix, when the first part is missing or moved, holds
another run (another ``run_id``), ends before the step the resume continues after, or when the
parts overlap: a compare never reads half a run as if it were the whole."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TraceError
from ..trace.note_blocks import IncompleteStep
from ..trace.records import Trace
from ..trace.run_ids import RunIds
from ..trace.run_parts import FirstPart
from .layout import parallel_rank_folders

Found = Mapping[int, Mapping[int, Path]]  # step -> rank -> folder


@dataclass
class RootSteps:
    """The steps of one root, merged across ranks, and what was read on the way."""

    root: Path
    steps: list[tuple[int, Trace]]
    sources: dict[int, str]
    ids: RunIds
    incomplete: list[IncompleteStep] = field(default_factory=list)
    held: tuple[int, ...] = ()  # every step found in the root (complete or not)


def joined_parts(root: Path, found: Found, read: Callable[[Path, Found], RootSteps]) -> list[RootSteps]:
    """The parts of the run recorded in ``root`` (``found``: its steps), first part first;
    ``read`` merges the steps of one root. A step folder given alone is read alone."""
    parts = [read(root, found)]
    if not any((root / f"step{step}").is_dir() for step in found):
        return parts  # one step folder: that step alone, as asked
    while (pointers := parts[0].ids.first_part()) is not None:
        later = parts[0]
        pointer = next(iter(pointers.values()))
        first = pointer.place(later.root)
        told = f"{later.root} continues the run recorded in {first} (after its step {pointer.step})"
        held = parallel_rank_folders(first) if first.is_dir() else None
        before = {step: ranks for step, ranks in (held or {}).items() if step <= pointer.step}
        if not before:
            what = "does not exist" if not first.exists() else f"holds none of its steps up to {pointer.step}"
            raise TraceError(
                f"{told}, but {first} {what}: the first part was moved or removed; put it back there "
                f"(the manifests of {later.root} say {pointer.root!r}), then compare again"
            )
        _check_order(told, later, pointer, max(before))
        part = read(first, before)
        _check_run(told, part, pointers)
        parts.insert(0, part)
    return parts


def _check_order(told: str, later: RootSteps, pointer: FirstPart, last: int) -> None:
    overlap = [s for s in later.held if s <= pointer.step]
    if overlap:
        raise TraceError(
            f"{told}, but {later.root} holds step{overlap[0]} too: the parts overlap (two runs, or "
            "a part copied into the other?); each step of a run is recorded in one part"
        )
    if last != pointer.step:
        raise TraceError(
            f"{told}, but the first part ends at step {last}: its steps {last + 1}..{pointer.step} "
            "are missing (moved, removed or cut short); put them back, then compare again"
        )


def _check_run(told: str, part: RootSteps, pointers: Mapping[int, FirstPart]) -> None:
    for rank, pointer in sorted(pointers.items()):
        held = sorted(part.ids.runs.get(rank, {}))
        if held != [pointer.run_id]:
            shown = ", ".join(h[:12] for h in held) or "no run id"
            raise TraceError(
                f"{told}, run {pointer.run_id[:12]} on rank {rank}, but {part.root} holds {shown} there: "
                "another run replaced the first part (a rerun into it?); the parts are not one run"
            )
