"""The marker a step leaves while it runs: ``step<N>/.rank<R>.in-step``, made when the
``Recorder`` starts step N on rank R and removed when the step's folder is published or given
up (``training.run_root``). A run killed or crashed inside step N leaves it, and a compare of
the root says the run stopped inside step N (``parallel.steps``). Torch-free: the Recorder
writes it, the compare reads it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

IN_STEP_SUFFIX = ".in-step"


def in_step_marker(folder: Path) -> Path:
    """The marker of rank folder ``step<N>/rank<R>``: ``step<N>/.rank<R>.in-step``."""
    return folder.parent / f".{folder.name}{IN_STEP_SUFFIX}"


def stopped_inside(folder: Path) -> bool:
    """Whether the run of rank folder ``folder`` stopped inside its step (the marker is there)."""
    return os.path.lexists(in_step_marker(folder))


def begin_step(folder: Path) -> tuple[Path, ...]:
    """A step of rank folder ``folder`` begins: its marker (best effort: a step is never
    stopped for it); returns the folders made for it (the step's, the root's), deepest first."""
    marker = in_step_marker(folder)
    made = tuple(p for p in (marker.parent, *marker.parent.parents) if not p.exists())
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    return made


def end_step(folder: Path, made: tuple[Path, ...] = ()) -> None:
    """The step of ``folder`` was published or given up: no marker, and none of the folders
    ``made`` for it left empty."""
    with contextlib.suppress(OSError):
        in_step_marker(folder).unlink()
    for path in made:
        try:
            path.rmdir()  # only when empty
        except OSError:
            break
