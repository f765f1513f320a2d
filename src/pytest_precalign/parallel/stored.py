"""Reading stored runs, the one reader (no torch): one side of a compare (our trace, an
msprobe dump, or rank folders merged into one), every (step, rank) of a run, and one rank of
one step (the golden run of a live compare). ``run.stored_runs`` writes them."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import TraceError
from ..trace.records import Trace
from .layout import ParallelLayout


def load_side(path: str | Path, parallel: ParallelLayout | None = None) -> Trace:
    """A pytest-precalign trace directory or an msprobe dump (a rank folder, or a step or
    dump folder holding one rank), detected from its files; a multi-rank side (rank folders
    with ``parallel`` manifests, or an msprobe dump with ``parallel`` given) merged into one."""
    from ..trace.native_io import read_trace
    from .sides import load_parallel_side

    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root}: no such file or directory")
    merged = load_parallel_side(root, parallel)
    if merged is not None:
        return merged
    if os.path.lexists(root / "manifest.json"):  # a link or a FIFO: the reader refuses it, naming it
        return read_trace(root)
    from ..msprobe import is_msprobe_dump, read_msprobe_dump

    if is_msprobe_dump(root):
        return read_msprobe_dump(root)
    below = []
    if root.is_dir():
        below = sorted(
            p.name + "/"
            for p in root.iterdir()
            if p.is_dir() and ((p / "manifest.json").is_file() or is_msprobe_dump(p))
        )
    hint = f"; it holds the runs {', '.join(below[:6])}: pass one of them" if below else ""
    from .steps import interrupted_steps

    partial = interrupted_steps(root)
    if partial:
        hint += (
            f"; {', '.join(s + '/' for s in partial)} holds only a writer's temporary folder: the run "
            "was interrupted before a step was complete"
        )
    raise TraceError(
        f"{root}: neither a pytest-precalign trace (manifest.json) nor an msprobe dump (dump.json){hint}"
    )


def load_sides(path: str | Path) -> dict[tuple[int, int], Trace]:
    """Every (step, rank) of a stored run: one for our traces, several for an msprobe dump
    root or step folder."""
    root = Path(path)
    if (root / "manifest.json").is_file() or not root.exists():
        return {(0, 0): load_side(root)}
    from ..msprobe import read_msprobe_set

    try:
        return read_msprobe_set(root)
    except TraceError:
        return {(0, 0): load_side(root)}  # its message says what the folder is not


def load_rank(path: str | Path, step: int, rank: int) -> Trace:
    """The trace of ``step`` on ``rank``: a trace folder (all its steps), a ``Recorder`` root
    (``PATH/step<N>/rank<R>``, native or msprobe), an msprobe rank folder, or an msprobe step
    folder or dump root holding ``(step, rank)``."""
    from ..msprobe.layout import recorded_by_us
    from .sides import read_rank_folder

    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root}: no such file or directory")
    folder = root / f"step{step}" / f"rank{rank}"
    if not (root / "manifest.json").is_file() and (
        (folder / "manifest.json").is_file() or recorded_by_us(folder)
    ):
        return read_rank_folder(folder)
    if (root / "manifest.json").is_file() or (root / "dump.json").is_file():
        return load_side(root)
    from ..msprobe import is_msprobe_dump

    if is_msprobe_dump(root):
        found = load_sides(root)
        if (step, rank) in found:
            return found[(step, rank)]
        raise TraceError(f"{root}: msprobe dump has no step {step} rank {rank} (it has {sorted(found)[:8]})")
    raise TraceError(
        f"{root}: neither a pytest-precalign trace (manifest.json), a Recorder root "
        f"with step{step}/rank{rank}/, nor an msprobe dump (dump.json)"
    )
