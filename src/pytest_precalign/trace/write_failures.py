"""A recorded step that could not be written (a full disk, a permission, a quota): its rank
folder is not there, and a one-line note beside it, ``step<N>/.rank<R>.write-failed``, says
why, so that a later compare reports "rank0/ was not written: No space left on device"
rather than a folder that is merely missing. Torch-free: the Recorder writes the note, the
compare of a run root reads it (``parallel.steps``)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

NOTE_SUFFIX = ".write-failed"
_NOTE_BYTES = 4096  # what is read of a note (it is one line)
_RESERVED = 512  # bytes a note holds from before the write: its reason fits on a full disk


def write_failure_reason(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the error's words and its errno name."""
    name = errno.errorcode.get(exc.errno or 0)
    words = exc.strerror or str(exc)
    return f"{words} ({name})" if name else words


def note_path(folder: Path) -> Path:
    """The note of rank folder ``folder`` (``step<N>/rank<R>``): ``step<N>/.rank<R>.write-failed``."""
    return folder.parent / f".{folder.name}{NOTE_SUFFIX}"


def open_write_note(folder: Path) -> Path | None:
    """Before writing rank folder ``folder``: its note, created empty (an inode, no data: it
    can still be made when the disk is too full for the step), so that a failed write leaves
    a note even when its reason cannot be written. None when not even that can be made."""
    note = note_path(folder)
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    except OSError:
        return None
    with contextlib.suppress(OSError):  # room for the reason, taken while there is some
        os.write(fd, b" " * _RESERVED)
    os.close(fd)
    return note


def close_write_note(note: Path | None) -> None:
    """The write succeeded: no note."""
    if note is not None:
        with contextlib.suppress(OSError):
            note.unlink()


def leave_write_failure_note(
    note: Path | None, step: int, reason: str, made: tuple[Path, ...]
) -> Path | None:
    """The write failed: ``reason`` into the note (best effort: an empty note stays when the
    disk is too full for one line); returns the note. Without a note, the folders ``made``
    for the step are removed when empty, so no empty step folder is left behind."""
    if note is None:
        for made_folder in made:  # deepest first
            try:
                made_folder.rmdir()
            except OSError:  # not empty (another rank's folder), or gone
                break
        return None
    line = f"step {step}: {reason}".encode()[: _RESERVED - 1] + b"\n"
    with contextlib.suppress(OSError):
        fd = os.open(note, os.O_WRONLY)
        try:
            os.pwrite(fd, line.ljust(_RESERVED), 0)  # over the reserved bytes: no new block
        finally:
            os.close(fd)
    return note


def read_write_failure_note(folder: Path) -> str | None:
    """What the note of rank folder ``folder`` says (None: no note)."""
    try:
        with open(note_path(folder), "rb") as f:
            text = f.read(_NOTE_BYTES).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text.partition(": ")[2] or text  # "": it has no reason (the disk was full already)
