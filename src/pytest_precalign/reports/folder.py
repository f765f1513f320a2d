"""A report folder (``precalign compare/run --report DIR``, pytest's ``--align-report DIR``)
published as one set: report.json, report.html and compare_result.csv are written into a
temporary sibling and swapped in for ``DIR`` in one step (``_atomic.publish_dir``), under a lock
on ``DIR``'s parent folder, so a reader, a kill, a full disk or a second writer leaves the
previous set or the new one, never files of two runs side by side. A folder that holds
anything else is refused: it is replaced whole."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from .._atomic import dir_lock, publish_dir, temp_dir_beside, write_file_atomic
from ..errors import ConfigError, ReportError
from .compare_csv import CSV_FILE

REPORT_FILES = ("report.json", "report.html", CSV_FILE)


def check_report_folder(directory: str | Path, option: str = "--report") -> Path:
    """A report folder that can be made or replaced: checked before anything runs, and again
    under the lock before it is replaced."""
    folder = Path(directory)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(
            f"{option}: {folder}: {existing} is a file, not a directory (report.json goes into a directory)"
        )
    if existing == folder:
        if Path.cwd().resolve().is_relative_to(folder.resolve()):
            raise ConfigError(
                f"{option}: {folder}: is the working directory (or holds it); a report folder is "
                f"replaced whole: name a folder of its own (e.g. {option} report)"
            )
        try:
            others = sorted(p.name for p in folder.iterdir() if p.name not in REPORT_FILES)
        except OSError as exc:
            raise ReportError(f"{option}: {folder}: cannot read the folder: {exc.strerror or exc}") from None
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise ConfigError(
                f"{option}: {folder}: holds {shown}, not a report: a report folder is replaced whole "
                f"(allowed inside: {', '.join(REPORT_FILES)}); name a new folder or an earlier report's"
            )
    return folder


def publish_report(folder: Path, files: Mapping[str, str], option: str = "--report") -> Path:
    """Write ``files`` (name -> text) as the whole content of ``folder``, swapped in at once."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with dir_lock(folder.parent):
            check_report_folder(folder, option)
            _remove_leftovers(folder)
            tmp = temp_dir_beside(folder, prefix=_TEMP_PREFIX.format(folder.name))
            try:
                for name, text in files.items():
                    write_file_atomic(tmp / name, text)
                publish_dir(tmp, folder)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        kept = "the previous report is kept" if folder.is_dir() else "nothing was written"
        raise ReportError(
            f"{option}: {folder}: cannot write the report: {exc.strerror or exc}{where}; {kept}"
        ) from None
    return folder


_TEMP_PREFIX = ".{}.report-"


def _remove_leftovers(folder: Path) -> None:
    """Temporary siblings of a writer that was killed (held under the lock: none is in use)."""
    temp = _TEMP_PREFIX.format(folder.name)
    for entry in os.scandir(folder.parent):
        if (
            entry.name.startswith(temp)
            and entry.name.endswith(".tmp")
            and entry.is_dir(follow_symlinks=False)
        ):
            shutil.rmtree(entry.path, ignore_errors=True)
