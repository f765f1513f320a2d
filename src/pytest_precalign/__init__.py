"""pytest-precalign: alignment regression testing of deep-learning models as pytest tests.

The data flow, one module per stage: ``config`` -> ``sources`` -> ``recorder`` -> ``trace``
(``trace_io`` on disk) -> ``mapping`` -> ``compare`` (``metrics`` x ``tolerances``) ->
``verdict`` -> ``report``; ``runner`` drives a case, ``plugin`` and ``cli`` wire it up.
Importing this package does not import torch.
"""

from __future__ import annotations

from .errors import AlignmentMismatch, CaseError, ConfigError, PrecalignError, SourceError, TraceError

__version__ = "0.1.0"

__all__ = [
    "AlignmentMismatch",
    "CaseError",
    "ConfigError",
    "PrecalignError",
    "SourceError",
    "TraceError",
    "__version__",
]
