"""pytest-precalign: alignment regression testing of deep-learning models as pytest tests.

The data flow, one package per stage: ``config`` -> ``sources`` -> ``recording`` -> ``trace``
(``trace.native_io`` on disk) -> ``mapping`` -> ``compare`` (``compare.metrics`` x
``compare.tolerances``) -> ``verdict`` -> ``reports``; ``parallel`` reads stored runs and
merges rank folders, ``run`` drives a case, ``training`` records a user's own training loop
(what a step did and is planned to do: ``steps``; megatron-core's stack: ``megatron_core``),
``plugin`` and ``cli`` wire it up (``__main__``: ``python -m pytest_precalign``). Beside the
flow: ``checkpoints`` (checkpoints read from disk and compared), ``msprobe`` (msprobe dumps read
and written), ``baseline`` (stored baselines, ``precalign record``), ``calibration``
(``precalign calibrate``), ``search`` (the divergence search), ``align_runner`` (the fixture),
``specs`` (what a case asks of its verdict, below both ``config`` and ``verdict``).
Under every stage: ``vocabulary`` (the words as ``Literal`` types), ``errors`` (the error
classes), ``yaml_reader`` (YAML with line numbers), ``_atomic`` (the one atomic writer),
``untrusted`` (how files from elsewhere are read), ``case_scheduling`` (a case's items on one
xdist worker). Public: ``Recorder``, the recorders of a framework's own run
(``PrecalignCallback``, ``PrecalignLightningCallback``, ``AccelerateSteps``), ``megatron_cpu``, the
``align_runner`` fixture's ``AlignRunner`` (``check`` fails the test, ``compare`` returns the
``CaseRun``), ``ToleranceTable``, ``MappingSpec`` and the errors. ``redaction``: the one rule
that keeps secrets out of what a recording writes.
Importing this package does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import AlignmentMismatch, CaseError, ConfigError, PrecalignError, SourceError, TraceError

# Eager: importing it does not import torch (entering it does).
from .training import megatron_cpu

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .align_runner import AlignRunner
    from .compare.tolerances import ToleranceTable
    from .mapping.spec import MappingSpec
    from .megatron_core.megatron_step import megatron_train_step
    from .run.outcome import CaseRun
    from .training.accelerate_steps import AccelerateSteps
    from .training.hf_callback import PrecalignCallback
    from .training.lightning_callback import PrecalignLightningCallback
    from .training.recorder import Recorder

# Public names loaded on first access, so that importing the package (the pytest plugin)
# stays cheap: the Recorder, the callback and the Megatron step import torch; the types the
# align_runner fixture takes and returns pull in the compare and run stages.
_LAZY = {
    "AccelerateSteps": "training.accelerate_steps",
    "AlignRunner": "align_runner",
    "CaseRun": "run.outcome",
    "MappingSpec": "mapping.spec",
    "PrecalignCallback": "training.hf_callback",
    "PrecalignLightningCallback": "training.lightning_callback",
    "Recorder": "training.recorder",
    "ToleranceTable": "compare.tolerances",
    "megatron_train_step": "megatron_core.megatron_step",
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
    "AccelerateSteps",
    "AlignRunner",
    "AlignmentMismatch",
    "CaseError",
    "CaseRun",
    "ConfigError",
    "MappingSpec",
    "PrecalignCallback",
    "PrecalignError",
    "PrecalignLightningCallback",
    "Recorder",
    "ToleranceTable",
    "SourceError",
    "TraceError",
    "__version__",
    "megatron_cpu",
    "megatron_train_step",
]
