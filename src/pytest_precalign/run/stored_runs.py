"""Stored runs on disk, both directions in one place: read a side (our trace format or an
msprobe dump, detected from its files) and write one (``record.format``: ours or msprobe's)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import TraceError
from ..parallel.layout import ParallelLayout
from ..trace.records import Trace


def load_side(path: str | Path, parallel: ParallelLayout | None = None) -> Trace:
    """A pytest-precalign trace directory or an msprobe dump (a rank folder, or a step or
    dump folder holding one rank), detected from its files; a multi-rank side (rank folders
    with ``parallel`` manifests, or an msprobe dump with ``parallel`` given) merged into one."""
    from ..parallel.sides import load_parallel_side
    from ..trace.native_io import read_trace

    root = Path(path)
    if not root.exists():
        raise TraceError(f"{root}: no such file or directory")
    merged = load_parallel_side(root, parallel)
    if merged is not None:
        return merged
    if (root / "manifest.json").is_file():
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
    from ..parallel.steps import interrupted_steps

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


def write_side(trace: Trace, path: Path, fmt: str) -> Path:
    """Save one side of a case: our trace format, or an msprobe dump (``record: {format}``)."""
    if fmt == "msprobe":
        from ..msprobe import write_msprobe_dump

        return write_msprobe_dump(trace, path)
    from ..trace.native_io import write_trace

    return write_trace(trace, path)


def save_case_traces(baseline: Trace, candidate: Trace, root: Path, fmt: str) -> None:
    """Save a case's two sides under ``root/baseline`` and ``root/candidate``. On a full or
    read-only disk: one ``TraceError`` naming the folder, and no folder left behind that this
    call created (each side's write is atomic; the folders above it are removed when empty)."""
    created = [p for p in (root, *root.parents) if not p.exists()]
    written: list[Path] = []
    try:
        written.append(write_side(baseline, root / "baseline", fmt))
        written.append(write_side(candidate, root / "candidate", fmt))
    except OSError as exc:
        for side in written:  # a half-saved case is no saved case
            shutil.rmtree(side, ignore_errors=True)
        for folder in created:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        raise TraceError(f"{root}: cannot save the traces: {exc.strerror or exc}") from None
