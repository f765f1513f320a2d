"""Which run wrote each step of a recording root: the ``run_id`` and ``launch_id`` every
``Recorder`` manifest holds, written by the recorder and checked by the compare. Torch-free.

* ``run_id``: made when a recorder claims its root for a run from step 0 (``training.run_root``),
  kept by a resumed run, which continues the recording (read from the last step it keeps, or
  from its first part when it resumes into a new root that points to it, ``run_parts``),
  made anew by a run resumed into a new root with no pointer (a run of its own there).
  Per rank: the ranks of one run need not share it.
* ``launch_id``: the launcher's id of this launch (``TORCHELASTIC_RUN_ID``, which torchrun
  makes a new uuid for every single-node launch; absent without one or when it is ``none``).
  Every rank of one launch shares it; a resumed launch has a new one.

A reader (``parallel.sides``) collects them (``RunIds``) as it reads a root's steps and
refuses a mix: one rank's steps from more than one ``run_id`` (a rerun replacing the root, or
two runs writing into it, while it was read), or one step's ranks from more than one
``launch_id`` (a rerun of some ranks beside another launch's). A manifest without them
(written before this change, or by another tool) takes no part in the check.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..untrusted import bounded_repr, read_json
from .environment import MSPROBE_MANIFEST
from .run_parts import FirstPart, read_pointer

RUN_ID_KEY = "run_id"
LAUNCH_ID_KEY = "launch_id"
_LAUNCH_ENV = "TORCHELASTIC_RUN_ID"
_NO_LAUNCH = ("", "none", "test_run_id")  # torchrun's defaults when no rendezvous id was made


def new_run_id() -> str:
    return uuid.uuid4().hex


def launch_id() -> str | None:
    """This launch's id (see the module doc), or None."""
    value = os.environ.get(_LAUNCH_ENV, "").strip()
    return None if value.lower() in _NO_LAUNCH else value[:200]


def run_ids(run_id: str) -> dict[str, str]:
    """The keys a Recorder manifest holds (``run_id``, and ``launch_id`` under a launcher)."""
    launch = launch_id()
    return {RUN_ID_KEY: run_id, **({LAUNCH_ID_KEY: launch} if launch else {})}


def kept_manifest(root: Path, rank: int, kept: list[int]) -> Mapping[str, Any]:
    """The manifest of the last step a run resumed into ``root`` keeps on ``rank`` (empty when
    it keeps none, or it cannot be read)."""
    for step in reversed(kept):
        folder = root / f"step{step}" / f"rank{rank}"
        for name in ("manifest.json", MSPROBE_MANIFEST):
            if os.path.lexists(folder / name):
                try:
                    found = read_json(folder / name, TraceError)
                except TraceError:
                    return {}
                return found if isinstance(found, Mapping) else {}
    return {}


def continued_run_id(root: Path, rank: int, kept: list[int]) -> str:
    """The ``run_id`` a run resumed into ``root`` continues: the one of the last step it keeps
    on ``rank`` (a new one when it keeps none, or the step holds none)."""
    found = kept_manifest(root, rank, kept).get(RUN_ID_KEY)
    return found if isinstance(found, str) and found else new_run_id()


def _short(value: str) -> str:
    return value[:12] + ("…" if len(value) > 12 else "")


class RunIds:
    """The ids of every step and rank folder of a root, as read; ``check`` refuses a mix."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[int, dict[str, list[int]]] = {}  # rank -> run_id -> its steps
        self.launches: dict[int, dict[str, list[int]]] = {}  # step -> launch_id -> its ranks
        self.parts: dict[int, dict[FirstPart | None, list[int]]] = {}  # rank -> pointer -> steps

    def add(self, step: int, rank: int, manifest: Mapping[str, Any], where: str) -> None:
        pointer = read_pointer(manifest, where)
        self.parts.setdefault(rank, {}).setdefault(pointer, []).append(step)
        for key, table, outer, inner in (
            (RUN_ID_KEY, self.runs, rank, step),
            (LAUNCH_ID_KEY, self.launches, step, rank),
        ):
            value = manifest.get(key)
            if value is None:
                continue
            if not isinstance(value, str) or not value:
                raise TraceError(f"{where}: {key!r} must be a non-empty string, got {bounded_repr(value)}")
            table.setdefault(outer, {}).setdefault(value, []).append(inner)

    def check(self) -> None:
        for rank, held in sorted(self.runs.items()):
            if len(held) > 1:
                raise TraceError(
                    f"{self.root}: holds steps of more than one run on rank {rank} ({_seen(held, 'step')}): "
                    "a rerun replaced the recording part-way, or two runs wrote into this root, while "
                    "it was read; compare again once one run has finished, or record each run into its "
                    "own root"
                )
        for step, held in sorted(self.launches.items()):
            if len(held) > 1:
                raise TraceError(
                    f"{self.root / f'step{step}'}: its ranks come from more than one launch "
                    f"({_seen(held, 'rank')}): a rerun replaced some ranks' folders; compare again "
                    "once one run has finished, or record each run into its own root"
                )

    def first_part(self) -> dict[int, FirstPart] | None:
        """Each rank's pointer to the run's first part (``trace.run_parts``), or None when the
        root holds the whole run; a root whose steps or ranks disagree on it is refused."""
        seen = {p for held in self.parts.values() for p in held}
        if seen == {None} or not seen:
            return None
        for rank, held in sorted(self.parts.items()):
            if len(held) > 1:
                shown = "; ".join(
                    f"step{min(steps)}: {'none' if p is None else p.root}" for p, steps in held.items()
                )
                raise TraceError(
                    f"{self.root}: its steps of rank {rank} disagree on where the run's first part is "
                    f"({shown}): two runs wrote into this root; record each run into its own root"
                )
        pointers = {rank: next(iter(held)) for rank, held in self.parts.items()}
        places = {(p.root, p.step) if p else None for p in pointers.values()}
        if len(places) > 1:
            raise TraceError(
                f"{self.root}: its ranks disagree on where the run's first part is "
                f"({', '.join(sorted(str(p) for p in places))}): record each run into its own root"
            )
        return {rank: p for rank, p in pointers.items() if p is not None}


def _seen(held: Mapping[str, list[int]], what: str) -> str:
    parts = []
    for value, where in list(held.items())[:4]:
        shown = ", ".join(f"{what}{n}" for n in sorted(where)[:4]) + (" ..." if len(where) > 4 else "")
        parts.append(f"{shown} from {_short(value)}")
    return "; ".join(parts)
