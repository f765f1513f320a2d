"""A folder made once per test session, whichever xdist worker or test module asks first: the
session's common temp folder (the same for every worker), a lock file, a marker when done."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def common_temp(tmp_path_factory: Any) -> Path:
    """The session's temp folder every xdist worker shares (the base temp without xdist)."""
    base: Path = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def locked(tmp_path_factory: Any, name: str) -> Iterator[Path]:
    """``name``'s folder of the common temp folder, held by this process until the block ends."""
    shared = common_temp(tmp_path_factory)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield shared / name


def made_once(tmp_path_factory: Any, name: str, make: Callable[[Path], None]) -> Path:
    """``name``'s folder, filled by ``make(folder)`` the first time any worker asks for it."""
    with locked(tmp_path_factory, name) as folder:
        done = folder.with_name(f"{name}.done")
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            make(folder)
            done.write_text("ok")
    return folder
