"""Stored runs on disk: write a case's sides (``record.format``: ours or msprobe's); reading
them is ``parallel.stored`` (re-exported here: ``load_side``, ``load_sides``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import TraceError
from ..parallel.stored import load_side, load_sides
from ..trace.records import Trace

__all__ = ["load_side", "load_sides", "save_case_traces", "write_side"]


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
