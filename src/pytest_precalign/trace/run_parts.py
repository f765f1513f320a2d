"""A run recorded in parts: a run resumed into a new root (a cluster job relaunched into a new
output folder) writes, in every manifest of the new root, where its first part is. Torch-free:
the ``Recorder`` writes the pointer (``training.run_root.first_part``), the compare follows it
(``parallel.sides``) and joins the parts into one run.

The pointer, the manifest's ``"continues"`` key: ``{"root": the first part's root (relative to
the new root when it can be), "run_id": the run's id there, "step": the last step it recorded
before the resume}``. The new root keeps that ``run_id`` (``trace.run_ids``): the parts are one
run. The first part's steps after ``step`` are the work the resume repeated: not part of the run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..untrusted import bounded_repr

CONTINUES_KEY = "continues"


@dataclass(frozen=True)
class FirstPart:
    """Where the part before a resume is (see the module doc)."""

    root: str  # as written: relative to the root that holds the pointer, or absolute
    run_id: str
    step: int  # the last step the first part recorded before the resume

    def place(self, root: Path) -> Path:
        """The first part's root, as seen from ``root`` (the root holding the pointer)."""
        return Path(os.path.normpath(root / self.root))

    def as_json(self) -> dict[str, Any]:
        return {"root": self.root, "run_id": self.run_id, "step": self.step}


def pointer_to(first: Path, root: Path, run_id: str, step: int) -> FirstPart:
    """The pointer ``root`` holds to ``first``: relative to ``root`` when it can be (both
    moved together, the pointer still holds), else absolute."""
    target = os.path.abspath(first)
    try:
        shown = os.path.relpath(target, os.path.abspath(root))
    except ValueError:  # another drive (Windows)
        shown = target
    return FirstPart(shown, run_id, step)


def read_pointer(manifest: Mapping[str, Any], where: str) -> FirstPart | None:
    """The manifest's pointer to its run's first part, or None; a malformed one is refused."""
    value = manifest.get(CONTINUES_KEY)
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or set(value) != {"root", "run_id", "step"}
        or not isinstance(value["root"], str)
        or not value["root"]
        or not isinstance(value["run_id"], str)
        or not value["run_id"]
        or not isinstance(value["step"], int)
        or isinstance(value["step"], bool)
        or value["step"] < 0
    ):
        raise TraceError(
            f"{where}: {CONTINUES_KEY!r} must be {{root: a path, run_id: a string, step: an integer "
            f">= 0}} (where the run's first part is), got {bounded_repr(value)}"
        )
    return FirstPart(value["root"], value["run_id"], value["step"])
