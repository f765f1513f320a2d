"""pytest-precalign: alignment regression testing of deep-learning models as pytest tests.

The data flow, one package per stage: ``config`` -> ``sources`` -> ``recording`` -> ``trace``
(``trace.native_io`` on disk) -> ``mapping`` -> ``compare`` (``compare.metrics`` x
``compare.tolerances``) -> ``verdict`` -> ``reports``; ``run`` drives a case, ``training``
records a user's own training loop, ``plugin`` and ``cli`` wire it up.
Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AlignmentMismatch, CaseError, ConfigError, PrecalignError, SourceError, TraceError

# Eager: importing it does not import torch (entering it does).
from .training import megatron_cpu

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .training.hf_callback import PrecalignCallback
    from .training.megatron_step import megatron_train_step
    from .training.recorder import Recorder

# Public names whose modules import torch: loaded on first access, so that importing the
# package (the pytest plugin) stays cheap.
_LAZY = {
    "Recorder": "training.recorder",
    "PrecalignCallback": "training.hf_callback",
    "megatron_train_step": "training.megatron_step",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "AlignmentMismatch",
    "CaseError",
    "ConfigError",
    "PrecalignCallback",
    "PrecalignError",
    "Recorder",
    "SourceError",
    "TraceError",
    "__version__",
    "megatron_cpu",
    "megatron_train_step",
]
