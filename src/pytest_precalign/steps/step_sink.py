"""What a recorded run's optimizer steps are written into (``StepSink``): the public
``Recorder`` (``PrecalignCallback``, ``PrecalignLightningCallback``, ``AccelerateSteps``) and
the tool's case trainers' sinks (``run.trainers.lightning``) implement it, and
``optimizer_steps.OptimizerSteps`` writes each step through it. No torch import at run time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from ..trace.records import Record
    from ..trace.step_scalars import StepScalars
    from ..trace.training_record import TrainingSettings


class StepSink(Protocol):
    """A step's life: ``seek(step)``, ``start(model)``, the model's outputs
    (``record_output``), then ``write_settings`` / ``record_initial_params`` on the first step,
    ``record_scalars``, ``stop()`` and ``step()``; ``close()`` once the run ends."""

    mode: str  # "scalars": no layer and no output is recorded (the sink records its own)

    def seek(self, step: int) -> None: ...

    def start(self, model: torch.nn.Module | Sequence[torch.nn.Module]) -> None: ...

    def record_output(
        self, kind: str, tensor: torch.Tensor, deps: tuple[str, ...] = (), name: str | None = None
    ) -> Record | None: ...

    def write_settings(self, settings: TrainingSettings) -> None: ...

    def record_initial_params(self, summary: dict[str, Any]) -> None: ...

    def record_scalars(self, scalars: StepScalars) -> Any: ...

    def stop(self) -> Any: ...

    def step(self) -> None: ...

    def close(self, failed: bool = False) -> None: ...
