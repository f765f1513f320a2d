"""The console scripts a benchmark runs (``precalign``, ``msprobe``), found next to the running
interpreter first: a venv's python run without activating the venv has its scripts beside it,
not on PATH."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def find_command(name: str) -> str:
    """The path of console script ``name``: beside ``sys.executable``, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(
            f"{name}: not found beside {sys.executable} nor on PATH "
            f"(install it into this interpreter's environment)"
        )
    return found
