"""Files from elsewhere are untrusted: the one place that says how the tool reads them.

* ``plain_name``: a name taken from a file's contents (an msprobe ``data_name``, a shard in an
  HF ``weight_map``) is a plain file name inside that file's folder: no ``/``, ``..``,
  absolute path or NUL byte.
* ``open_regular``: a user file is opened without blocking and read only when it is a regular
  file (a FIFO or a device would hang the tool or never end).
* ``read_json``: a JSON file is refused after its size and first bytes, before it is read
  whole, like the YAML reader does; ``loads_json`` reads JSON already in memory (a
  safetensors header, a JSON line). Both are the one way the tool reads JSON: a key twice in
  one object, at any depth, is refused (Python's ``json`` keeps the last value silently, so a
  crafted file could say two things and be read as the second).
* ``bounded_repr``: a value from a file shown in a message is cut to a bounded excerpt (a
  YAML alias bomb once made a 722 MB message).

Each takes the error class of its caller's stage (``TraceError``, ``SourceError``, ...).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .errors import PrecalignError

# A dump.json of a big model at level mix over many modules stays far below this.
MAX_JSON_BYTES = 1 << 30
SNIFF_BYTES = 8192
REPR_CHARS = 200

ErrorType = Callable[[str], PrecalignError]

_ITEMS = 6  # items shown of a list or mapping
_DEPTH = 3  # nesting levels shown


def _short(value: Any, depth: int) -> str:
    """A repr that looks at no more than ``_ITEMS`` items per level and ``_DEPTH`` levels
    (``repr`` of a YAML alias bomb would walk billions of items first)."""
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        brackets = "[]" if isinstance(value, list) else "()" if isinstance(value, tuple) else "{}"
        if depth >= _DEPTH:
            return brackets[0] + ("..." if value else "") + brackets[1]
        if isinstance(value, dict):
            head = itertools.islice(value.items(), _ITEMS)
            parts = [f"{_short(k, depth + 1)}: {_short(v, depth + 1)}" for k, v in head]
        else:
            parts = [_short(item, depth + 1) for item in itertools.islice(value, _ITEMS)]
        if len(value) > _ITEMS:
            parts.append(f"... {len(value) - _ITEMS} more")
        return brackets[0] + ", ".join(parts) + brackets[1]
    if isinstance(value, (str, bytes, bytearray)):
        cut = value[:REPR_CHARS]
        return repr(bytes(cut) if isinstance(cut, bytearray) else cut) + (
            "..." if len(value) > REPR_CHARS else ""
        )
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    if isinstance(value, (bool, int, float, type(None))):
        return repr(value)
    return f"<{type(value).__name__}>"


def bounded_repr(value: Any, limit: int = REPR_CHARS) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, without building the whole repr
    of a huge or deeply nested value first."""
    text = _short(value, 0)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_name(name: str, folder: Path, what: str, error: ErrorType) -> Path:
    """``folder / name`` when ``name`` is a plain file name; otherwise one error naming
    ``what`` (e.g. "dump.json: record 'x' data_name") and what is allowed."""
    if (
        not name
        or "\0" in name
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or Path(name).is_absolute()
    ):
        raise error(
            f"{what}: {bounded_repr(name)} is not a plain file name; a name inside a file must "
            f"name a file in {folder} (no '/', '..', absolute path or NUL byte)"
        )
    return folder / name


def open_regular(path: Path, error: ErrorType, what: str = "a file") -> IO[bytes]:
    """``path`` opened for reading, once it is known to be a regular file (opened with
    O_NONBLOCK so that a FIFO does not block the open, then checked with fstat)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise error(f"{path}: is a directory, expected {what}") from None
    except ValueError:  # a NUL byte in the path
        raise error(f"{bounded_repr(str(path))}: not a valid path (NUL byte)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: is {_kind(mode)}, expected {what} (a regular file)")
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_regular(path: Path, error: ErrorType, what: str = "a file") -> None:
    """Refuse ``path`` unless it is a regular file (for readers that open by name: a FIFO
    would block them forever). A missing file raises FileNotFoundError for the caller to name."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise
    except ValueError:
        raise error(f"{bounded_repr(str(path))}: not a valid path (NUL byte)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise error(f"{path}: is {_kind(mode)}, expected {what} (a regular file)")


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"


def _no_duplicates(error: ErrorType, path: Path | str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise error(
                        f"{path}: key {bounded_repr(key)} appears twice in one object (each key once)"
                    )
                seen.add(key)
        return out

    return hook


def read_json(
    path: Path,
    error: ErrorType,
    *,
    what: str = "a JSON file",
    why: str = "",
    bad: str = "not valid JSON",
) -> Any:
    """A JSON file's contents; one error naming the file when it is missing (``why`` says why
    it is needed), not a regular file, bigger than ``MAX_JSON_BYTES``, binary, not JSON, holds
    a key twice in one object, or an integer too long to convert."""
    try:
        with open_regular(path, error, what) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_JSON_BYTES:
                raise error(f"{path}: {size} bytes; expected {what} of at most {MAX_JSON_BYTES >> 20} MiB")
            head = handle.read(SNIFF_BYTES)
            if b"\0" in head:
                raise error(f"{path}: a binary file (NUL bytes); expected {what}")
            data = head + handle.read(MAX_JSON_BYTES + 1 - len(head))
    except FileNotFoundError:
        raise error(f"{path}: missing" + (f" ({why})" if why else "")) from None
    if len(data) > MAX_JSON_BYTES:
        raise error(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB; expected {what}")
    return loads_json(data, error, path, bad=bad)


def loads_json(data: bytes | str, error: ErrorType, where: Path | str, *, bad: str = "not valid JSON") -> Any:
    """JSON text from ``where`` (a file, or a part of one), read as ``read_json`` reads a file:
    one error naming ``where`` when it is not JSON, holds a key twice in one object (at any
    depth), nests too deeply or holds an integer too long to convert."""
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates(error, where))
    except RecursionError:
        raise error(f"{where}: {bad}: nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{where}: {bad}: {exc}") from None
    except ValueError as exc:  # an integer of more digits than int() converts (4300 by default)
        if "digits" not in str(exc):
            raise
        raise error(
            f"{where}: {bad}: an integer of more than {sys.get_int_max_str_digits()} digits "
            "(no number the tool reads is that long)"
        ) from None


def numbered_folders(
    path: Path, pattern: re.Pattern[str], error: ErrorType, what: str = "a recording"
) -> dict[tuple[str, int], Path]:
    """The entries of ``path`` whose names ``pattern`` matches (``step<N>``, ``rank<R>``...;
    its last group the number), by (name without the number, number). A folder of a recording
    is a real folder: a symbolic link (never followed: it could point anywhere), a FIFO or a
    file under such a name is refused, and so are two names of one number (``step05/`` beside
    ``step5/``, ``rank00/`` beside ``rank0/``), which would otherwise be read as one."""
    out: dict[tuple[str, int], Path] = {}
    for entry in sorted(path.iterdir()):
        m = pattern.match(entry.name)
        if not m:
            continue
        mode = os.lstat(entry).st_mode
        if stat.S_ISLNK(mode):
            raise error(
                f"{entry}: a symbolic link inside {what}; its folders are read only as real folders "
                "(a link is never followed)"
            )
        if not stat.S_ISDIR(mode):
            raise error(f"{entry}: is {_kind(mode)}, expected a folder of {what}")
        number = m.group(m.lastindex or 0)
        key = (entry.name[: m.start(m.lastindex or 0)], int(number))
        if key in out:
            raise error(
                f"{path}: {out[key].name}/ and {entry.name}/ name the same {key[0]} {key[1]}; "
                f"{what} has one folder for each (rename or remove one)"
            )
        out[key] = entry
    return out


def refuse_link(path: Path, error: ErrorType, what: str = "a recording") -> None:
    """Refuse ``path`` when it is a symbolic link: a file of ``what`` is read only as itself,
    never through a link (which could point at any file of the reader's machine)."""
    try:
        mode = os.lstat(path).st_mode
    except (OSError, ValueError):
        return  # missing or unreadable: the reader that opens it says so
    if stat.S_ISLNK(mode):
        raise error(
            f"{path}: a symbolic link inside {what}; its files are read only as real files (never followed)"
        )


SHOWN_CHARS = 2000  # a value from a file shown in a verdict or report: at most this much of it


def cut_text(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` when it is at most ``limit`` characters; else its head, saying how much was cut
    (a 50 MB string in a crafted plan once made 50 MB of output and a 15 MB report)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters cut)"
