"""Small file helpers shared by the tests."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def digest(folder: Path) -> dict[str, str]:
    """file name -> sha256 of each file directly in ``folder``: to tell whether it was rewritten."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def reseal(path: Path) -> None:
    """Rewrite the checksums of the recording folder holding ``path`` (a file in it, or the
    folder) for what is in it now, as someone crafting a recording elsewhere would: the
    readers' deeper checks are then what refuses it, not the checksums."""
    from pytest_precalign.trace.checksums import CHECKSUM_FILE, Checksums

    folder = path if path.is_dir() else path.parent
    while not (folder / CHECKSUM_FILE).is_file():
        if folder.parent == folder:
            return  # not a sealed recording (msprobe's own dump, an older recording)
        folder = folder.parent
    Checksums().seal(folder)


def copy_trace(source: Path, to: Path, edit: Callable[[dict[str, Any]], Any] | None = None) -> Path:
    """A copy of trace folder ``source`` at ``to``, its manifest changed by ``edit`` (which
    changes the dict it is given): a recording damaged or crafted the way a file from
    elsewhere can be."""
    shutil.copytree(source, to)
    if edit is not None:
        manifest = json.loads((to / "manifest.json").read_text())
        edit(manifest)
        (to / "manifest.json").write_text(json.dumps(manifest))
        reseal(to / "manifest.json")
    return to
