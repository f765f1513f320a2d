"""Typed errors of pytest-precalign.

Every error a user can cause is a ``PrecalignError``: the plugin turns it into one
``pytest.UsageError`` line and the CLI into exit code 2, never a traceback.
``AlignmentMismatch`` is the one failure that is a test verdict, not a usage error.
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


class AlignmentMismatch(AssertionError):
    """Raised by a check whose candidate is not aligned with its baseline."""
