"""Atomic writes, the one implementation: a file or a directory is written beside its target
under a temporary name, flushed to disk, and renamed into place, so a reader (or a crash, a
full disk, a kill -9) sees the old version or the new one, never a part."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
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
    """Put a fully written temporary directory in place of ``target``: swapped with the old
    one in one step where the file system can (Linux ``renameat2(RENAME_EXCHANGE)``), else
    the old one is moved aside first; the old one is removed only once the new one is in
    place, so a crash leaves either the old or the new directory, never a partial one."""
    fsync_dir(tmp)
    if target.exists() and _exchange(tmp, target):
        shutil.rmtree(tmp, ignore_errors=True)  # ``tmp`` holds the old directory now
    elif target.exists():
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, aside / "old")
        os.replace(tmp, target)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, target)
    fsync_dir(target.parent)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux 3.15+); False where the system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    done = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if done == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


@contextlib.contextmanager
def dir_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on the directory ``folder`` while the block
    runs: writers that take it publish one at a time (it is released when the process ends,
    also by a kill)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


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
