"""Atomic writes, the one implementation: a file or a directory is written beside its target
under a temporary name, flushed to disk, and renamed into place, so a reader (or a crash, a
full disk, a kill -9) sees the old version or the new one, never a part."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


class TargetExists(FileExistsError):
    """``write_file_atomic(..., replace=False)`` found the target already there."""


def write_file_atomic(target: Path, data: str | bytes, *, replace: bool = True) -> Path:
    """Write ``target`` through a temp file in its folder, fsync, and a rename. With
    ``replace=False`` the final step is a hard link, which never replaces an existing file
    (``TargetExists``). The file gets the umask's permissions, as ``open`` would give it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise TargetExists(str(target)) from None
            os.unlink(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def current_umask() -> int:
    """The process's umask (Linux: read, not set; elsewhere set and restored at once)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def share_file(path: Path) -> None:
    """Give a file written by a library (safetensors writes 0600) the umask's permissions."""
    os.chmod(path, 0o666 & ~current_umask())


def temp_dir_beside(target: Path, prefix: str | None = None) -> Path:
    """A new temporary directory next to ``target`` (to be filled, then ``publish_dir``-ed),
    with the umask's permissions: mkdtemp's 0700 would make a shared baseline or trace private."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{target.name}.", suffix=".tmp", dir=target.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


def publish_dir(tmp: Path, target: Path) -> None:
    """Put a fully written temporary directory in place of ``target``: the old one (if any)
    is moved aside first and removed only once the new one is in place, so a crash leaves
    either the old or the new directory, never a partial one."""
    fsync_dir(tmp)
    if target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, aside / "old")
        os.replace(tmp, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, target)
    fsync_dir(target.parent)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (best effort: not every file system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
