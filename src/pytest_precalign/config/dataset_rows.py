"""Token rows of a ``kind: dataset`` file, read as the untrusted file it is: as bytes, one row
at a time, only as many rows as a case needs (a 100 MB file for a 2-step case reads two
batches, never the whole file), each row bounded in size. A binary or non-UTF-8 file, a
FIFO or a directory, a row of another length and a token id beyond int64 are one message
naming the file, the line and the row. Torch-free (the config reads it; so does the run).

Rows: ``.jsonl``, a JSON list of ids per line; any other suffix, whitespace-separated ids per
line. Blank lines are skipped (a row is a non-blank line).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import PrecalignError
from ..untrusted import ErrorType, bounded_repr, loads_json, open_regular

MAX_ROW_BYTES = 1 << 24  # one row of ~2 million ids; a longer line is not a row of tokens
MAX_TOKEN_ID = (1 << 63) - 1  # token ids become int64 tensors
_ID = re.compile(r"[0-9]+")
_LONG = re.compile(rb"[0-9]{20,}")  # more digits than any int64 has

Rows = tuple[tuple[int, ...], ...]


def read_rows(path: Path, count: int, error: ErrorType) -> Rows:
    """The first ``count`` rows of ``path`` (fewer when the file has fewer; the caller says
    what that means). ``error`` (``ConfigError`` for the config, ``CaseError`` for the run)
    is raised once, naming the file, the line and the row."""
    rows: list[tuple[int, ...]] = []
    try:
        handle = open_regular(path, error, "a dataset of token rows")
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    with handle:
        line = 0
        while len(rows) < count:
            raw = handle.readline(MAX_ROW_BYTES + 1)
            if not raw:
                break
            line += 1
            where = f"{path}:{line}: row {len(rows) + 1}"
            if len(raw) > MAX_ROW_BYTES:
                raise error(f"{where}: longer than {MAX_ROW_BYTES >> 20} MiB; expected a row of token ids")
            if not raw.strip():
                continue
            values = _row(raw, path.suffix == ".jsonl", where, error)
            if rows and len(values) != len(rows[0]):
                raise error(f"{where}: a row of {len(values)} ids, the first row has {len(rows[0])}")
            rows.append(values)
    if not rows:
        raise error(f"{path}: the file has no rows of token ids")
    return tuple(rows)


def _row(raw: bytes, jsonl: bool, where: str, error: ErrorType) -> tuple[int, ...]:
    if b"\0" in raw:
        raise error(f"{where}: a binary file (NUL byte); expected text rows of token ids")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
            "expected a row of token ids"
        ) from None
    huge = _LONG.search(raw)
    if huge is not None:
        digits = huge.group().decode()
        shown = digits if len(digits) <= 40 else f"{digits[:20]}... ({len(digits)} digits)"
        raise error(f"{where}: token id {shown} is beyond int64 (token ids are 0..{MAX_TOKEN_ID})")
    values: object
    if jsonl:
        try:
            values = loads_json(text, error, where)
        except PrecalignError:
            values = None
    else:
        fields = text.split()
        values = [int(v) for v in fields] if all(_ID.fullmatch(v) for v in fields) else None
    if (
        not isinstance(values, list)
        or not values
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
    ):
        shape = "a JSON list of ids, e.g. [1, 2, 3]" if jsonl else "ids separated by spaces, e.g. 1 2 3"
        raise error(
            f"{where}: expected a row of token ids >= 0 ({shape}), got {bounded_repr(text.strip(), 60)}"
        )
    big = max(values)
    if big > MAX_TOKEN_ID:
        raise error(f"{where}: token id {big} is beyond int64 (token ids are 0..{MAX_TOKEN_ID})")
    return tuple(values)
