"""Where the rank folders of an msprobe dump are.

msprobe writes ``<root>/step<N>/<rank>/dump.json`` where ``<rank>`` is ``rank<N>`` when
torch.distributed is initialised and ``proc<PID>`` when it is not (one process: rank 0).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import TraceError
from ..trace.environment import MSPROBE_MANIFEST
from ..untrusted import numbered_folders

DUMP_FILE = "dump.json"
MANIFEST_SIDECAR = MSPROBE_MANIFEST  # our Recorder's manifest beside dump.json (trace.environment)
_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(rank|proc)(\d+)$")


def step_of(folder: Path) -> int | None:
    m = _STEP.match(folder.name)
    return int(m.group(1)) if m else None


def recorded_by_us(folder: Path) -> bool:
    """A rank folder our ``Recorder`` wrote in msprobe's layout (its manifest beside dump.json)."""
    try:
        return (folder / DUMP_FILE).is_file() and (folder / MANIFEST_SIDECAR).is_file()
    except OSError:
        return False


def rank_of(folder: Path) -> int | None:
    m = _RANK.match(folder.name)
    if not m:
        return None
    return int(m.group(2)) if m.group(1) == "rank" else 0  # a PID is not a rank


def _children(path: Path, kind: re.Pattern[str]) -> list[Path]:
    return sorted(numbered_folders(path, kind, TraceError, "a dump").values())  # no link, no look-alike


def rank_folders(path: str | Path) -> dict[tuple[int, int], Path]:
    """(step, rank) -> rank folder, for a dump root, a step folder or a rank folder."""
    root = Path(path)
    if not root.is_dir():
        raise TraceError(f"{root}: no msprobe dump folder there")
    if (root / DUMP_FILE).exists() or rank_of(root) is not None:
        # A rank folder (its dump.json may still be missing: the reader says so).
        return {(step_of(root.parent) or 0, rank_of(root) or 0): root}
    steps = _children(root, _STEP)
    found: dict[tuple[int, int], Path] = {}
    for step_dir in steps or [root]:
        step = step_of(step_dir) or 0
        for rank_dir in _children(step_dir, _RANK):
            key = (step, rank_of(rank_dir) or 0)
            if key in found:
                raise TraceError(
                    f"{step_dir}: both {found[key].name}/ and {rank_dir.name}/ are step {step}, "
                    f"rank {key[1]} (several proc<PID> folders are several runs); pass one of them"
                )
            found[key] = rank_dir
    if not found:
        below = sorted(p.name + "/" for p in root.iterdir() if p.is_dir() and is_msprobe_dump(p))
        hint = f"; it holds the dumps {', '.join(below[:6])}: pass one of them" if below else ""
        raise TraceError(
            f"{root}: no msprobe dump there: expected {DUMP_FILE}, rank<N>/ or proc<PID>/ "
            f"folders holding it, or step<N>/ folders above those{hint}"
        )
    return found


LEVEL_NAMES = {"rank": "a rank folder", "step": "a step folder", "root": "a dump root"}


def dump_level(path: str | Path) -> str | None:
    """Which msprobe folder ``path`` is: ``rank`` (holds dump.json), ``step`` (holds rank
    folders) or ``root`` (holds step folders); None when it is none of them."""
    root = Path(path)
    try:
        if (root / DUMP_FILE).is_file() or rank_of(root) is not None:
            return "rank"
        if not root.is_dir():
            return None
        if _children(root, _STEP):
            return "root"
        if _children(root, _RANK):
            return "step"
    except OSError:
        return None
    return None


def single_rank_folder(path: str | Path) -> Path:
    """The one rank folder under ``path``; an error naming the choices when there are several."""
    found = rank_folders(path)
    if len(found) == 1:
        return next(iter(found.values()))
    root = Path(path)
    names = [str(p.relative_to(root)) for p in found.values()]
    shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
    raise TraceError(
        f"{root}: holds {len(names)} msprobe rank folders ({shown}); one rank folder (the one "
        f"holding {DUMP_FILE}) is needed here, e.g. {root / names[0]}; read_msprobe_set reads them all"
    )


def is_msprobe_dump(path: str | Path) -> bool:
    """A rank folder with dump.json, or a step folder / dump root above one. Never raises."""
    root = Path(path)
    try:
        if (root / DUMP_FILE).is_file():
            return True
        for pattern in ("*/" + DUMP_FILE, "step*/*/" + DUMP_FILE):
            for hit in root.glob(pattern):
                rank_dir = hit.parent
                if rank_of(rank_dir) is not None and (
                    pattern[0] == "*" or step_of(rank_dir.parent) is not None
                ):
                    return True
    except OSError:
        return False
    return False
