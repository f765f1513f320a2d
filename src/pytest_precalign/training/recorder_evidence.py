"""What a ``Recorder``'s next manifest carries beside the records: this step's scalars
(``record_scalars``), the parameters before any update (``record_initial_params``), the
run's settings and plan (``record_settings``, ``write_settings``) and the precision they
name, which every later manifest's ``dtype`` says (see ``recorder``'s module doc)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..trace.step_scalars import SCALARS_KEY, StepScalars, scalars_manifest
from ..trace.training_record import RunRecord, TrainingSettings, run_record_keys
from .recorder_options import tuples
from .run_root import check_selected_steps


class RecorderEvidence:
    """The evidence half of ``Recorder`` (which sets the attributes declared here)."""

    steps: frozenset[int] | None
    written: list[Path]
    _step: int
    _continues: bool  # a resumed run continuing the steps the root holds
    _scalars: StepScalars | None = None  # this step's, written at stop()
    _initial: dict[str, Any] | None = None  # initial_params, written with the next folder
    _settings: TrainingSettings | None = None  # the run's settings, written with the next folder
    _precision: str | None = None  # what the forward computes in (the settings'), every manifest

    def record_scalars(self, scalars: StepScalars | None = None, **fields: Any) -> StepScalars:
        """What this optimizer step did (``StepScalars``, or its fields: ``loss``, ``lr``,
        ``grad_norm``...; see ``steps.step_evidence`` to measure them), written into this
        step's manifest at ``stop()`` -- on every step of a selected rank, also where ``steps=``
        selects no layers (then the folder holds the manifest alone)."""
        if scalars is None:
            scalars = StepScalars(step=self._step, **tuples(fields))
        elif fields:
            raise ConfigError("Recorder.record_scalars: pass a StepScalars or its fields, not both")
        if scalars.step != self._step:
            raise ConfigError(f"Recorder.record_scalars: scalars of step {scalars.step} in step {self._step}")
        self._scalars = scalars
        return scalars

    def record_initial_params(self, summary: dict[str, Any] | torch.nn.Module) -> None:
        """The parameters before any update (a model, or ``step_evidence.initial_params``),
        written into the next folder's manifest (``initial_params``)."""
        if isinstance(summary, torch.nn.Module):
            from ..steps.run_settings import named_parameters
            from ..steps.step_evidence import initial_params

            summary = initial_params(named_parameters(summary))
        self._initial = dict(summary)

    def record_settings(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        *,
        steps: int,
        clip_grad: float | None = None,
        micro_batches: int = 1,
        loss_normalisation: str | None = None,
        precision: str | None = None,
        autocast: bool = False,
        gradient_checkpointing: bool | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> TrainingSettings:
        """The run's settings and plan (see the module doc), written into the next folder's
        manifest; call it before step 0, before the scheduler first steps. ``steps``: the
        optimizer steps the loop will take; ``precision``: what the forward computes in
        (default: the parameters' dtype); ``loss_normalisation``: how the loss of a step's
        micro-batches is normalised (``trace.training_record.LOSS_NORMALISATIONS``)."""
        from ..steps.run_settings import loop_settings

        settings = loop_settings(
            model,
            optimizer,
            scheduler,
            steps=steps,
            clip_grad=clip_grad if clip_grad else None,
            micro_batches=micro_batches,
            loss_normalisation=loss_normalisation,
            precision=precision,
            autocast=autocast,
            gradient_checkpointing=gradient_checkpointing,
            arguments=arguments or {},
        )
        self.write_settings(settings)
        return settings

    def write_settings(self, settings: TrainingSettings) -> None:
        """Typed settings (``PrecalignCallback`` builds them from the Trainer's), written into
        the next folder's manifest; their plan's precision becomes every later ``dtype``."""
        if settings.plan is not None and self._step == 0 and not self.written:
            check_selected_steps(self.steps, len(settings.plan.lr), "Recorder")
        self._settings = settings
        if settings.plan is not None and settings.plan.precision is not None:
            self._precision = settings.plan.precision

    def _step_evidence(self) -> RunRecord:
        """This step's run record (what the next manifest carries: ``step_evidence_keys``)."""
        scalars = {} if self._scalars is None else {self._scalars.step: self._scalars}
        settings = None if self._continues else self._settings  # a resumed run's: the root has them
        run = RunRecord(settings, scalars, self._initial)
        self._scalars, self._initial, self._settings = None, None, None
        return run


def step_evidence_keys(run: RunRecord) -> dict[str, Any]:
    """A step's run record as its manifest keys, in the order the ``Recorder`` writes them
    (scalars, initial parameters, settings)."""
    out: dict[str, Any] = {}
    if run.scalars:
        out[SCALARS_KEY] = scalars_manifest(run.scalars)
    out.update(run_record_keys(initial_params=run.initial_params))
    out.update(run_record_keys(settings=run.settings))
    return out
