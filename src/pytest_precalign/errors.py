"""Typed errors of pytest-precalign.

Every error a user can cause is a ``PrecalignError``: the plugin turns it into one
``pytest.UsageError`` line and the CLI into exit code 2, never a traceback.
``AlignmentMismatch`` is the one failure that is a test verdict, not a usage error.

The policy, by entry point: a bad config file, marker, option or ini value is a
``ConfigError`` (the plugin: ``pytest.UsageError``; the CLI: exit 2). In the Python API
(``Recorder``, ``align_runner``, ``megatron_cpu``) every argument error -- a bad value, a
missing file named by an argument, a call out of order -- is a ``ConfigError`` too, never a
bare ``ValueError``/``TypeError``; ``TraceError``/``SourceError``/``CaseError`` are for what
an argument pointed at (a corrupt trace, a model that cannot be built, a case that cannot run).
"""

from __future__ import annotations


class PrecalignError(Exception):
    """Base of every error caused by user input (config, mapping, trace, source)."""


class ConfigError(PrecalignError):
    """A config, tolerance table or mapping file is invalid."""


class SourceError(PrecalignError):
    """A model or input source cannot be resolved or built."""


class TraceError(PrecalignError):
    """A trace directory is missing, corrupt, or would be overwritten."""


class CaseError(PrecalignError):
    """A case cannot run as configured (e.g. weights that cannot be synced)."""


class ReportError(PrecalignError):
    """A report folder cannot be written (a full or read-only disk): the previous one is kept."""


class RecorderError(PrecalignError):
    """The training ``Recorder`` was called out of order or on a model it cannot record."""


class AlignmentMismatch(AssertionError):
    """Raised by a check whose candidate is not aligned with its baseline."""


def foreign_error(exc: BaseException, what: str) -> CaseError:
    """One line for an error that is not ours -- the user's model raising, a full or read-only
    disk, torch running out of memory: ``what`` raised ``Type: first line`` at the innermost
    frame outside installed packages and this one (the user's code, when it is there)."""
    import traceback
    from pathlib import Path

    frames = traceback.extract_tb(exc.__traceback__)
    ours = str(Path(__file__).resolve().parent)

    def foreign(filename: str) -> bool:
        return not (filename.startswith(ours) or "site-packages" in filename or "/lib/python" in filename)

    origin = next((f for f in reversed(frames) if foreign(f.filename)), frames[-1] if frames else None)
    lines = str(exc).strip().splitlines()
    text = f": {lines[0]}" if lines else ""
    at = f" (at {origin.filename}:{origin.lineno}, in {origin.name})" if origin is not None else ""
    return CaseError(f"{what} raised {type(exc).__name__}{text}{at}")
