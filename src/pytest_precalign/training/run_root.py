"""A recording root holds one run, decided before the run's first step (``claim_root``).

The ``Recorder`` (and so ``PrecalignCallback``, ``PrecalignLightningCallback`` and
``AccelerateSteps``, which record through it) claims its root on this rank when it first
starts a step:

* a run that begins at step 0 into a root already holding this rank's steps is refused there,
  before its first step trains (one ``RecorderError`` naming the steps found and the way
  out), unless ``overwrite=True``: then the old run's folders of this rank are all removed
  first, so a rerun with fewer steps leaves none of the old later steps behind;
* a run that begins at step ``k > 0`` is a resumed run (a Trainer's
  ``resume_from_checkpoint``, Lightning's ``ckpt_path``, a loop's ``Recorder.seek``): it
  continues the recording. The steps ``>= k`` already there were recorded by the run it
  resumes after its checkpoint (the work the resume repeats): they are removed first, the
  steps before ``k`` are kept, and the root compares as one run;
* two recorders of one process recording one root and rank at once (a callback added twice:
  the first is inside the very step the second starts) are refused: the second one's first
  step raises, before it trains. (A recorder left inside a later step by a run that raised
  in this process, a notebook's, does not stop a resumed run.)

Folders are removed by renaming them to a ``.tmp`` name first (readers skip those), so a
compare that runs meanwhile sees each step whole or not at all.

Each step's start leaves a marker, ``step<N>/.rank<R>.in-step`` (``trace.step_markers``),
removed when the step's folder is published or given up: a run killed or crashed inside step
N leaves it, and a compare of the root says the run stopped inside step N, in every mode, also
in scalars mode where nothing else of the step is written before its end.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import weakref
from pathlib import Path

from ..errors import ConfigError, RecorderError
from ..trace.run_ids import continued_run_id
from ..trace.run_parts import FirstPart, pointer_to
from ..trace.step_markers import IN_STEP_SUFFIX

_STEP = re.compile(r"step(0|[1-9][0-9]*)")

_HOLDERS: dict[tuple[str, int], weakref.ref[object]] = {}


def _key(root: Path, rank: int) -> tuple[str, int]:
    return os.path.realpath(root), rank


def this_ranks_steps(root: Path, rank: int, *, markers: bool = False) -> list[int]:
    """The steps of ``root`` that hold a folder of ``rank`` (``markers``: or only the marker
    of a step it began and never finished), in order."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    out = []
    for entry in entries:
        if not _STEP.fullmatch(entry.name):
            continue
        marked = markers and os.path.lexists(entry / f".rank{rank}{IN_STEP_SUFFIX}")
        if os.path.lexists(entry / f"rank{rank}") or marked:
            out.append(int(entry.name[4:]))
    return sorted(out)


def _remove(root: Path, rank: int, step: int) -> None:
    folder = root / f"step{step}"
    rank_dir = folder / f"rank{rank}"
    if os.path.lexists(rank_dir):
        aside = folder / f".rank{rank}.replaced.{os.getpid()}.tmp"
        os.replace(rank_dir, aside)
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink()
    with contextlib.suppress(OSError):
        (folder / f".rank{rank}{IN_STEP_SUFFIX}").unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when no other rank's folder is left in it


def _span(steps: list[int]) -> str:
    shown = ", ".join(f"step{s}" for s in steps[:5])
    return shown + (f" ... ({len(steps)} steps)" if len(steps) > 5 else "")


def claim_root(root: Path, rank: int, first: int, *, overwrite: bool, owner: object) -> list[int]:
    """Make ``root`` hold the run that ``owner`` records from step ``first`` on this rank (see
    the module doc); one ``RecorderError`` when it cannot. Returns the steps kept (those a
    resumed run recorded before its checkpoint)."""
    key = _key(root, rank)
    held = _HOLDERS.get(key)
    other = held() if held is not None else None
    if (
        other is not None
        and other is not owner
        and getattr(other, "in_step", False)
        and getattr(other, "current_step", None) == first
    ):
        raise RecorderError(
            f"Recorder: {root} (rank {rank}) is already being recorded by another recorder in this "
            "process (a PrecalignCallback added twice?): one recorder per root; keep one, or give "
            "each its own root"
        )
    found = this_ranks_steps(root, rank)
    if first == 0 and found and not overwrite:
        raise RecorderError(
            f"Recorder: {root} already holds a recorded run ({_span(found)} of rank {rank}); "
            "refusing to mix a new run into it: pass overwrite=True to replace it whole, "
            "record into another root, or resume the run (a checkpoint, Recorder.seek)"
        )
    begun = this_ranks_steps(root, rank, markers=True)  # and the steps a killed run only began
    for step in begun if first == 0 else [s for s in begun if s >= first]:
        _remove(root, rank, step)
    _HOLDERS[key] = weakref.ref(owner)
    return [s for s in found if s < first]


def first_part(first: Path, root: Path, rank: int, resumed_at: int) -> FirstPart:
    """The pointer a run resumed at step ``resumed_at`` into ``root`` writes to its first part,
    recorded into ``first`` (``trace.run_parts``); one ``RecorderError``, before the resumed run
    trains, when ``first`` holds none of this rank's steps before ``resumed_at``."""
    before = [s for s in this_ranks_steps(first, rank) if s < resumed_at]
    if not before:
        what = "does not exist" if not os.path.lexists(first) else f"holds no step before {resumed_at}"
        raise RecorderError(
            f"Recorder: the run resumed at step {resumed_at} into {root} continues the recording in "
            f"{first}, but {first} {what} (rank {rank}): give the first part's root as it is now "
            "(continues=), or record the resumed run without it (it then compares as a run of its "
            "own, from its first step)"
        )
    return pointer_to(first, root, continued_run_id(first, rank, before), before[-1])


def release_root(root: Path, rank: int, owner: object) -> None:
    """``owner`` no longer records into ``root`` (it was closed)."""
    key = _key(root, rank)
    held = _HOLDERS.get(key)
    if held is not None and held() in (owner, None):
        del _HOLDERS[key]


def check_selected_steps(selected: frozenset[int] | None, planned: int, who: str) -> None:
    """Refuse, before the run trains, a ``steps=`` selection holding steps the run will not
    take (``planned`` optimizer steps: 0 .. planned-1): they would record nothing."""
    if selected is None:
        return
    beyond = sorted(s for s in selected if s >= planned)
    if beyond:
        shown = ", ".join(str(s) for s in beyond[:8]) + (" ..." if len(beyond) > 8 else "")
        raise ConfigError(
            f"{who}: steps= {shown} beyond the run's {planned} optimizer steps (0..{planned - 1}): "
            "they would record nothing; select steps the run takes"
        )
