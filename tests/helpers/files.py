"""Small file helpers shared by the tests."""

from __future__ import annotations

import hashlib
from pathlib import Path


def digest(folder: Path) -> dict[str, str]:
    """file name -> sha256 of each file directly in ``folder``: to tell whether it was rewritten."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }
