"""What a recorded run's optimizer steps are written into (``StepSink``): the public
``Recorder`` (``PrecalignCallback``, ``PrecalignLightningCallback``, ``AccelerateSteps``) and
the tool's case trainers' sinks (``run.trainers.hf_trainer``, ``run.trainers.lightning``)
implement it; ``optimizer_steps.OptimizerSteps`` and the Trainer callback
(``training.hf_callback.TrainerSteps``) write each step through it. No torch import at run time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from ..trace.records import Record
    from ..trace.step_scalars import StepScalars
    from ..trace.training_record import TrainingSettings
    from ..vocabulary import RecordingMode


Deps = tuple[str, ...]  # the ids of the records an output was computed from (the loss's logits)


class StepSink(Protocol):
    """A step's life: ``seek(step)``, ``start(model)``, the model's outputs
    (``record_output``), ``updated()`` once the optimizer updated the parameters, then
    ``write_settings`` / ``record_initial_params`` on the first step, ``record_scalars``,
    ``stop()`` and ``step()``; ``close()`` once the run ends."""

    mode: RecordingMode  # "scalars": no layer and no output is recorded (the sink records its own)

    def seek(self, step: int) -> None: ...

    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None: ...

    def record_output(
        self, kind: str, tensor: Tensor, deps: Deps = (), name: str | None = None, call: int | None = None
    ) -> Record | None:
        """The model's ``kind`` output of micro-batch ``call`` (None: the next of ``name``)."""

    def write_settings(self, settings: TrainingSettings) -> None: ...

    def record_initial_params(self, summary: dict[str, dict[str, float]]) -> None: ...

    def record_scalars(self, scalars: StepScalars) -> object: ...

    def updated(self) -> None:
        """The step's optimizer update is done (before the scheduler steps)."""

    def stop(self) -> object: ...

    def step(self) -> None: ...

    def close(self, failed: bool = False) -> None: ...


class CaseSink(StepSink):
    """A case trainer's ``StepSink``: every event does nothing unless the sink overrides it
    (the case's hooks record the layers; the trainer keeps the scalars and settings)."""

    mode: RecordingMode = "scalars"

    def seek(self, step: int) -> None:
        return None

    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None:
        return None

    def record_output(
        self, kind: str, tensor: Tensor, deps: Deps = (), name: str | None = None, call: int | None = None
    ) -> Record | None:
        return None

    def write_settings(self, settings: TrainingSettings) -> None:
        return None

    def record_initial_params(self, summary: dict[str, dict[str, float]]) -> None:
        return None

    def record_scalars(self, scalars: StepScalars) -> None:
        return None

    def updated(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def step(self) -> None:
        return None

    def close(self, failed: bool = False) -> None:
        return None
