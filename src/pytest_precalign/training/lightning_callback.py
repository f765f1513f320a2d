"""Record a PyTorch Lightning run:
``L.Trainer(..., callbacks=[PrecalignLightningCallback("runs/pl", mode="stats")])``.

The layout, scalars and settings of ``PrecalignCallback`` (the ``transformers.Trainer`` one):
each optimizer step ``s`` (``trainer.global_step`` before the update, 0-based) is written as
``ROOT/step<s>/rank<R>/`` by a ``Recorder``, with the manifest's ``StepScalars``; the first
folder also has the run's settings and plan (``"training"``) and, when the run starts at step
0, ``initial_params``. ``mode="scalars"`` adds no module hooks and writes only the scalars;
``stats`` (default) / ``tensor`` / ``hash`` record every layer on the steps ``steps=``
selects. ``module="model"`` records that attribute of the LightningModule (names then match a
``transformers.Trainer`` recording of the same model); by default, the LightningModule.

Where each scalar comes from (``optimizer_steps`` for the hooks):

- ``loss``: the sum over the step's micro-batches of the loss each backward ran on (the
  ``"loss"`` of ``on_train_batch_end``'s outputs, before any AMP loss scaling) -- Lightning
  divides each micro-batch's loss by ``accumulate_grad_batches``, so this is the mean of
  micro-batch means the step trained on; ``micro_batches``: how many there were (a
  ``training_step`` returning None trains nothing and is not counted); ``loss_scale``: the
  AMP ``GradScaler``'s scale of the step, if the run has one.
- ``grad_norm`` (before clipping): the grads at ``on_before_optimizer_step``, which Lightning
  calls after the last backward and before it clips; ``clip_coef``: the grads' norm after
  Lightning's clipping (read when Lightning's optimizer closure returns, just before the
  update) over that one; ``zero_grads`` before clipping; ``lr`` / ``weight_decay`` per group as
  the update uses them; ``update_norm`` / ``param_norm`` after the update.
- ``batch_hash`` / ``tokens``: the batches ``training_step`` received (``on_train_batch_start``):
  ``step_evidence.batch_hash`` of ``input_ids``/``labels``/``attention_mask`` for a dict batch
  holding ``input_ids``, else a hash of every tensor of the batch row by row (no token count).

The plan (``TrainingPlan``) comes from the run's own optimizer and LR schedulers
(``trainer.optimizers``, ``trainer.lr_scheduler_configs``), stepped as Lightning steps them
(``interval``, ``frequency``, through the LightningModule's ``lr_scheduler_step``) over
``trainer.estimated_stepping_batches`` steps and put back exactly (``planned_lrs``);
``gradient_clip_val`` -> ``clip_grad`` (norm clipping), ``accumulate_grad_batches`` ->
``micro_batches``, ``loss_normalisation`` ``mean_of_micro_batch_means``, ``precision`` from
``trainer.precision``. No plan (``None``, the reason in ``arguments["plan"]``) with a
``ReduceLROnPlateau`` scheduler (its LR depends on a metric), an endless run or a run resumed
from a checkpoint. Automatic optimization with one optimizer only (a
manual-optimization module: record its steps with ``AccelerateSteps``'s pieces or a
``Recorder``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import lightning
import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from ..errors import ConfigError
from ..steps.optimizer_steps import OptimizerSteps, optimizer_arguments, parameter_names
from ..steps.run_settings import (
    adapters_of,
    frozen_parameters,
    gradient_checkpointing,
    json_safe,
    optimizer_plan,
    planned_lrs,
)
from ..steps.step_sink import StepSink
from ..trace.step_scalars import StepScalars
from ..trace.training_record import TrainingSettings
from .recorder import Recorder
from .resumed_parts import PART_KEY, continue_recording, run_part, stored_root
from .run_root import check_selected_steps

# trainer.precision -> (what the forward computes in, whether by autocast)
PRECISIONS = {
    "32-true": ("float32", False),
    "32": ("float32", False),
    "64-true": ("float64", False),
    "64": ("float64", False),
    "bf16-mixed": ("bfloat16", True),
    "16-mixed": ("float16", True),
    "bf16-true": ("bfloat16", False),
    "16-true": ("float16", False),
}
TRAINER_ARGUMENTS = (
    "max_steps",
    "max_epochs",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "gradient_clip_algorithm",
    "precision",
    "num_training_batches",
    "estimated_stepping_batches",
    "world_size",
)


class LightningUsageError(ConfigError):
    """The callback used where it cannot record (manual optimization, several optimizers)."""


class LightningSteps(Callback):
    """A Lightning run's optimizer steps measured and written into ``recorder`` (see the
    module doc): a ``Recorder`` (``PrecalignLightningCallback`` makes one), or what the tool's
    own Lightning case writes into (``run/trainers/lightning.py``; None there: the run's
    settings only). ``module``: the LightningModule's attribute to record (dotted)."""

    def __init__(self, recorder: StepSink | None, module: str | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.module = module
        self.settings: TrainingSettings | None = None
        self._steps: OptimizerSteps | None = None

    @property
    def scalars(self) -> dict[int, StepScalars]:
        """Each recorded step's scalars, by step."""
        return {} if self._steps is None else dict(self._steps.scalars)

    # -- Lightning's events -----------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not pl_module.automatic_optimization:
            raise LightningUsageError(
                "PrecalignLightningCallback: the LightningModule uses manual optimization; the "
                "callback records Lightning's automatic optimization (record a manual loop with "
                "pytest_precalign.Recorder)"
            )
        if len(trainer.optimizers) != 1:
            raise LightningUsageError(
                f"PrecalignLightningCallback: the run has {len(trainer.optimizers)} optimizers; "
                "automatic optimization steps exactly one"
            )
        selected = self.recorder.steps if isinstance(self.recorder, Recorder) else None  # a case's sink: all
        if selected is not None and math.isfinite(trainer.estimated_stepping_batches):  # said before training
            check_selected_steps(
                selected, int(trainer.estimated_stepping_batches), "PrecalignLightningCallback"
            )
        model = self._recorded(pl_module)
        optimizer = trainer.optimizers[0]
        self.settings = lightning_settings(trainer, pl_module, model)
        assert self.recorder is not None  # None: a case's plan only, which never starts its steps
        self._steps = OptimizerSteps(
            self.recorder,
            model,
            optimizer,
            self.settings,
            owner="PrecalignLightningCallback",
            scaler=getattr(trainer.precision_plugin, "scaler", None),
        )

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._steps is not None:
            self._steps.micro_batch(batch, trainer.global_step)

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if self._steps is not None:
            self._steps.before_clip()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._steps is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else None
        if isinstance(loss, torch.Tensor):  # the loss the backward ran on, not scaled by AMP
            self._steps.loss(loss)
        if self._steps.stepped:
            self._steps.close()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._remove()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._remove(failed=True)  # a step it raised in: the run stopped inside it

    # -- pieces -----------------------------------------------------------------------------
    def _remove(self, failed: bool = False) -> None:
        """The steps' hooks removed (which closes the sink), or the sink closed if no step began
        (a case's plan only has no sink)."""
        sink = self.recorder
        closing = self._steps.remove if self._steps is not None else None if sink is None else sink.close
        if closing is not None:
            closing(failed=failed)

    def _recorded(self, pl_module: LightningModule) -> torch.nn.Module:
        if self.module is None:
            return pl_module
        found: Any = pl_module
        for part in self.module.split("."):
            found = getattr(found, part, None)
        if not isinstance(found, torch.nn.Module):
            raise LightningUsageError(
                f"PrecalignLightningCallback: module={self.module!r}: the LightningModule "
                f"{type(pl_module).__name__} has no such submodule"
            )
        return found


class PrecalignLightningCallback(LightningSteps):
    """Record every optimizer step of a Lightning run in the ``Recorder``'s layout (see the
    module doc). ``mode``: a ``Recorder`` mode (``stats`` default, ``tensor``, ``hash``) or
    ``"scalars"``; ``module``: the LightningModule's attribute to record (dotted); other
    keyword arguments go to the ``Recorder``. Every recorder defaults to ``stats``;
    ``PrecalignCallback`` alone defaults to ``scalars`` (per-step scalars only, no hooks: cheap
    enough to leave on for a whole run). Each checkpoint keeps the root and run id (the
    callback's ``state_dict``): a run resumed from it (``ckpt_path``) into a new root points to
    its first part and compares as one run with it (``resumed_parts``); ``continues``: the
    first part's root, when it is no longer where the checkpoint says."""

    def __init__(
        self,
        root: str | Path,
        *,
        mode: str = "stats",
        steps: Iterable[int] | None = None,
        module: str | None = None,
        continues: str | Path | None = None,
        **recorder: Any,
    ) -> None:
        self._recorder = Recorder(root, mode=mode, steps=steps, **recorder)
        self._continues = continues
        self._stored: dict[str, Any] | None = None  # what the checkpoint resumed from kept
        super().__init__(self._recorder, module)

    def state_dict(self) -> dict[str, Any]:
        part = run_part(self._recorder, self._stored)
        return {PART_KEY: part} if part else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        part = state_dict.get(PART_KEY)
        self._stored = part if isinstance(part, dict) else None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_step > 0:
            step, name = int(trainer.global_step), "PrecalignLightningCallback"
            continue_recording(self._recorder, step, stored_root(self._stored), self._continues, name)
        super().on_train_start(trainer, pl_module)

    @property
    def written(self) -> list[Path]:
        """The folders written so far, in order."""
        return self._recorder.written


def lightning_settings(
    trainer: Trainer, pl_module: LightningModule, model: torch.nn.Module
) -> TrainingSettings:
    """The run's settings and plan, read from the Trainer, its optimizer and LR schedulers."""
    optimizer = trainer.optimizers[0]
    configs = trainer.lr_scheduler_configs
    clip = trainer.gradient_clip_val
    algorithm = trainer.gradient_clip_algorithm or "norm"
    precision, autocast = PRECISIONS.get(str(trainer.precision), (None, None))
    arguments: dict[str, Any] = {
        "Trainer": {key: json_safe(getattr(trainer, key, None)) for key in TRAINER_ARGUMENTS},
        "optimizer": optimizer_arguments(optimizer),
        "lr_schedulers": [
            {
                "class": f"{type(c.scheduler).__module__}.{type(c.scheduler).__qualname__}",
                "interval": c.interval,
                "frequency": c.frequency,
                "reduce_on_plateau": c.reduce_on_plateau,
            }
            for c in configs
        ],
    }
    plan = None
    why = _no_plan(trainer)
    lrs = None if why else _lightning_lrs(trainer, pl_module, int(trainer.estimated_stepping_batches))
    if why is None and lrs is None:
        why = "an LR scheduler without a state_dict cannot be stepped and put back"
    if lrs is not None:
        plan = optimizer_plan(
            model,
            optimizer,
            lrs,
            names=parameter_names(optimizer, model, pl_module),
            clip_grad=float(clip) if clip and algorithm == "norm" else None,
            micro_batches=int(trainer.accumulate_grad_batches),
            loss_normalisation="mean_of_micro_batch_means",
            precision=precision,
            autocast=autocast,
            gradient_checkpointing=gradient_checkpointing(model),
        )
    if why is not None:
        arguments["plan"] = f"not made: {why}"
    return TrainingSettings(
        trainer="lightning",
        framework="lightning",
        framework_version=lightning.__version__,
        arguments=arguments,
        plan=plan,
        adapters=adapters_of(model),
        frozen=frozen_parameters(model),
    )


def _no_plan(trainer: Trainer) -> str | None:
    """Why the run's LR at every step cannot be planned before it trains (None: it can)."""
    if any(c.reduce_on_plateau for c in trainer.lr_scheduler_configs):
        return "a ReduceLROnPlateau scheduler's LR depends on a metric"
    if not math.isfinite(trainer.estimated_stepping_batches):
        return "the run has no end (max_steps=-1 over an endless dataset)"
    if trainer.global_step > 0:
        return f"the run resumed at step {trainer.global_step}"
    return None


def _lightning_lrs(
    trainer: Trainer, pl_module: LightningModule, steps: int
) -> tuple[tuple[float, ...], ...] | None:
    """Each group's LR at each optimizer step: after update ``s``, the schedulers step as
    Lightning's loops step them -- an ``interval="step"`` one when its ``frequency`` divides
    the epoch's batch index + 1 of the update's last micro-batch, an ``interval="epoch"``
    one at the end of each epoch whose number + 1 its ``frequency`` divides."""
    configs = trainer.lr_scheduler_configs
    k = int(trainer.accumulate_grad_batches)
    batches = trainer.num_training_batches
    per_epoch = math.ceil(batches / k) if math.isfinite(batches) else None

    def advance(s: int) -> None:
        epoch, index = (s // per_epoch, s % per_epoch) if per_epoch else (0, s)
        last = min((index + 1) * k, int(batches)) if per_epoch else (index + 1) * k
        for config in configs:
            if config.interval == "step" and last % config.frequency == 0:
                pl_module.lr_scheduler_step(config.scheduler, None)
        if per_epoch and index == per_epoch - 1:
            for config in configs:
                if config.interval == "epoch" and (epoch + 1) % config.frequency == 0:
                    pl_module.lr_scheduler_step(config.scheduler, None)

    schedulers = [c.scheduler for c in configs]
    return planned_lrs(trainer.optimizers, schedulers, steps, advance, without=_WITHOUT)


_WITHOUT = "the plan steps the run's LR schedulers as Lightning would over trainer.estimated_stepping_batches"
