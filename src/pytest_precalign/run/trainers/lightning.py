"""A side trained by PyTorch Lightning's own loop (``training: lightning``): a
``LightningModule`` around the case's model (``CaseModule``: its ``training_step`` is the
case's forward and loss, ``case_step.case_forward``, its ``configure_optimizers`` the case's
``OptimizerSpec`` as the loop builds it: ``torch.optim`` AdamW / Adam / SGD over
``param_groups`` (weight decay, ``no_decay``), the schedule as a ``LambdaLR`` stepped by
Lightning every optimizer step), fitted by a ``lightning.Trainer`` on CPU with
``max_steps=case.steps``, ``accumulate_grad_batches=micro_batches``,
``gradient_clip_val=clip_grad`` (norm) and no logger, checkpoint or progress bar. The data of
step ``s`` is the case's batch ``s`` cut into ``micro_batches`` equal micro-batches, in order.

The loss is normalised per token over the whole step, as every case trainer does
(``steps/spec.py``): each micro-batch's loss is its summed loss over the step's tokens
(``case_forward`` with the step's token count), returned times ``accumulate_grad_batches``
because Lightning divides what ``training_step`` returns by it before the backward -- so the
step's grads are the other trainers'. ``CaseModule.loss_normalisation`` says what the module
does; ``"mean_of_micro_batch_means"`` is a plain user's Lightning (the micro-batch's mean loss
returned as is: Lightning's mean of micro-batch means), which the example suite's fault
``faults:lightning_mean_of_micro_batch_means`` plants.

Recording is ``PrecalignLightningCallback``'s events (``LightningSteps``, the base it builds a
``Recorder`` for, ``training/lightning_callback.py``): the plan
from Lightning's own optimizer and scheduler (``lightning_settings``), every step's scalars
measured after Lightning's clipping and accumulation (``OptimizerSteps``), written here into
the case's ``HookRecorder`` (``_CaseSink``) instead of a folder: the step skeleton opens each
step (step number, seed, the step replay's boundary) and records the parameters after the
update; the case's hooks record every layer's forward and backward, ``case_forward`` the logits
and the loss of each micro-batch.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer

from ...config.specs import CaseSpec, ModelSpec
from ...errors import CaseError
from ...recording import HookRecorder
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from ...steps.step_sink import CaseSink
from ...trace.training_record import RunRecord, TrainingSettings
from ...training.lightning_callback import LightningSteps, lightning_settings
from .case_step import case_forward, shifted_tokens, split_micro_batches
from .loop_optimizer import grouped_optimizer, make_scheduler, param_groups
from .skeleton import StepSkeleton

PER_TOKEN = "per_token_over_step"
MEAN_OF_MEANS = "mean_of_micro_batch_means"
# A CPU fit that writes nothing of its own (no logger, checkpoint, progress bar or summary).
QUIET: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "precision": "32-true",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
    "max_epochs": 1,
}


class CaseModule(LightningModule):
    """The case's model as a ``LightningModule`` (see the module doc); ``step_tokens``: the
    causal-LM loss's tokens of each step (over its micro-batches)."""

    loss_normalisation = PER_TOKEN

    def __init__(
        self,
        model: LoadedModel,
        case: CaseSpec,
        step_tokens: Sequence[int],
        recorder: HookRecorder | None = None,
    ) -> None:
        super().__init__()
        self.model = model.module
        self.loaded = model
        self.case = case
        self.micro = case.training.optimizer.micro_batches
        self.step_tokens = list(step_tokens)
        self.recorder = recorder
        self.quiet = False  # a step before the replay's boundary: nothing recorded
        self.step_loss: dict[int, torch.Tensor] = {}  # per token: the loop's sum of its micro-batches'

    def training_step(self, batch: Mapping[str, Any], batch_idx: int) -> torch.Tensor:
        step, call = divmod(batch_idx, self.micro)
        data = CaseInputs({k: v for k, v in batch.items() if k != "labels"}, batch.get("labels"))
        per_token = self.micro > 1 and self.loss_normalisation == PER_TOKEN
        tokens = self.step_tokens[step] if per_token else None
        recorder = None if self.quiet else self.recorder
        loss = case_forward(self.loaded, recorder, data, self.case, call, tokens)
        if loss is None:
            raise CaseError(
                f"case {self.case.name!r}: training: lightning needs a loss (loss: causal_lm or model)"
            )
        if not per_token:
            return loss  # Lightning divides it by accumulate_grad_batches: a mean of micro-batch means
        done = self.step_loss.get(step)
        self.step_loss[step] = loss.detach() if done is None else done + loss.detach()
        return loss * self.micro  # Lightning divides it by accumulate_grad_batches

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        with self.loaded.context():  # a recomputing model re-runs its forward here
            loss.backward(*args, **kwargs)

    def configure_optimizers(self) -> Any:
        spec = self.case.training.optimizer
        optimizer = grouped_optimizer(spec, param_groups(self.model.named_parameters(), spec))
        scheduler = make_scheduler(spec, optimizer, self.case.steps)
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class _CaseSink(CaseSink):
    """What ``OptimizerSteps`` writes a step into (a ``Recorder``'s place, ``StepSink``): the
    step opened and closed by the skeleton, the settings and initial parameters kept for the
    run record; the case's hooks record the layers, ``CaseModule`` the outputs (mode
    "scalars": no forward hook of OptimizerSteps)."""

    def __init__(self, steps: StepSkeleton, module: CaseModule) -> None:
        self.steps = steps
        self.module = module
        self.settings: TrainingSettings | None = None
        self.initial: dict[str, Any] = {}

    def seek(self, step: int) -> None:
        self.steps.begin(step, self.module.model, self.module.trainer.optimizers[0])
        self.module.quiet = self.steps.quiet

    def write_settings(self, settings: TrainingSettings) -> None:
        self.settings = settings

    def record_initial_params(self, summary: dict[str, Any]) -> None:
        self.initial = summary

    def updated(self) -> None:
        self.steps.updated()

    def close(self, failed: bool = False) -> None:
        self.steps.end()


class _CaseCallback(LightningSteps):
    """The Lightning callback's steps written into the case (``_CaseSink``; None: make the
    plan and stop before the first step), its plan saying the module's loss normalisation;
    ``stop_after``: stop the fit once that step's update is done (None: at ``max_steps``)."""

    def __init__(self, sink: _CaseSink | None, stop_after: int | None = None) -> None:
        super().__init__(sink, "model")
        self.stop_after = stop_after

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.recorder is None:  # the plan only: stop before the first step
            self.settings = lightning_settings(trainer, pl_module, self._recorded(pl_module))
            trainer.should_stop = True
        else:
            super().on_train_start(trainer, pl_module)
        if self.settings is not None and self.settings.plan is not None:
            normalisation = CaseModule.loss_normalisation
            if isinstance(pl_module, CaseModule):
                normalisation = pl_module.loss_normalisation
            plan = replace(self.settings.plan, loss_normalisation=normalisation)
            self.settings = replace(self.settings, plan=plan)
            if self._steps is not None:
                self._steps.settings = self.settings

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.stop_after is not None and trainer.global_step > self.stop_after:
            trainer.should_stop = True

    def _remove(self, failed: bool = False) -> None:
        if self._steps is not None:
            self._steps.remove(failed=failed)


class _MicroBatches(torch.utils.data.Dataset[dict[str, Any]]):
    """The case's steps' micro-batches in order (step ``s``: items ``s*k .. s*k+k-1``)."""

    def __init__(self, micro: Sequence[CaseInputs]) -> None:
        self.items = [{**m.model_inputs, **({} if m.labels is None else {"labels": m.labels})} for m in micro]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def _micro_batches(data: CaseInputs, case: CaseSpec) -> tuple[list[CaseInputs], list[int]]:
    """Every step's micro-batches in order, and each step's loss tokens."""
    micro: list[CaseInputs] = []
    tokens: list[int] = []
    for step in range(case.steps):
        parts = split_micro_batches(data.batch(step), case.training.optimizer.micro_batches, case)
        micro += parts
        tokens.append(shifted_tokens(parts))
    return micro, tokens


def _check_model(model: LoadedModel, case: CaseSpec) -> None:
    dtypes = {p.dtype for p in model.module.parameters() if p.is_floating_point()}
    devices = {p.device.type for p in model.module.parameters()}
    if dtypes - {torch.float32} or devices - {"cpu"}:
        raise CaseError(
            f"case {case.name!r}: training: lightning trains a float32 model on CPU "
            f"(precision 32-true); this side's parameters are {sorted(map(str, dtypes))} on "
            f"{sorted(devices)}"
        )


@contextmanager
def _lightning_fit() -> Iterator[str]:
    """A scratch root for the fit, Lightning's own info lines and its CPU warnings silenced
    (the case's report says what happened)."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with tempfile.TemporaryDirectory(prefix="precalign-lightning-") as root, warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*does not have many workers.*")
            warnings.filterwarnings("ignore", ".*LeafSpec.*")
            warnings.filterwarnings("ignore", ".*in eval mode at the start of training.*")  # case.train
            yield root
    finally:
        logger.setLevel(level)


@contextmanager
def _kept_modes(module: torch.nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in module.modules()]
    try:
        yield
    finally:
        for submodule, training in modes:
            submodule.training = training


def _fit(
    module: CaseModule, case: CaseSpec, micro: Sequence[CaseInputs], callback: _CaseCallback, root: str
) -> Trainer:
    spec = case.training.optimizer
    trainer = Trainer(
        **QUIET,
        default_root_dir=root,
        max_steps=case.steps,
        accumulate_grad_batches=spec.micro_batches,
        gradient_clip_val=spec.clip_grad,
        gradient_clip_algorithm="norm" if spec.clip_grad is not None else None,
        callbacks=[callback],
    )
    loader = torch.utils.data.DataLoader(_MicroBatches(micro), batch_size=None, shuffle=False)
    module.train(case.training.train)  # the case's mode (dropout on or off), as the loop trains
    trainer.fit(module, loader)
    return trainer


def _settings(settings: TrainingSettings | None, case: CaseSpec) -> TrainingSettings:
    if settings is None or settings.plan is None:
        why = None if settings is None else settings.arguments.get("plan")
        raise CaseError(f"case {case.name!r}: the Lightning side made no plan ({why})")
    return replace(
        settings,
        arguments={
            **settings.arguments,
            "LightningModule": f"{CaseModule.__module__}.CaseModule",
            "loss": (
                "each micro-batch's summed loss / the step's tokens x accumulate_grad_batches"
                if settings.plan.loss_normalisation == PER_TOKEN
                else "each micro-batch's mean loss (Lightning divides it by accumulate_grad_batches)"
            ),
        },
    )


class LightningTrainer:
    """``training: lightning`` (see the module doc)."""

    def plan(
        self, model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, seed: int
    ) -> TrainingSettings:
        """The settings (``"training"`` block) this side's fit will write, before it trains:
        the same ``CaseModule`` and ``lightning.Trainer``, stopped once Lightning has set up
        its optimizer and scheduler (nothing trained)."""
        _check_model(model, case)
        micro, tokens = _micro_batches(data, case)
        callback = _CaseCallback(None)
        with _lightning_fit() as root, _kept_modes(model.module):
            _fit(CaseModule(model, case, tokens), case, micro, callback, root)
        return _settings(callback.settings, case)

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        """Fit the side through the case's steps while ``steps.recorder``'s hooks record it,
        each step opened and closed by ``steps``; returns the manifest's training evidence."""
        _check_model(model, case)
        micro, tokens = _micro_batches(data, case)
        module = CaseModule(model, case, tokens, steps.recorder)
        sink = _CaseSink(steps, module)
        boundary = steps.boundary
        callback = _CaseCallback(sink, stop_after=None if boundary is None else boundary.step)
        try:
            with _lightning_fit() as root:
                _fit(module, case, micro, callback, root)
        finally:
            sink.close()
        # the step's loss summed as the loop sums it (Lightning's is the same loss / k, summed in float64)
        scalars = {
            s: replace(v, loss=float(module.step_loss[s])) if s in module.step_loss else v
            for s, v in callback.scalars.items()
        }
        last = steps.count(case.steps)
        if sorted(scalars) != list(range(last)):
            raise CaseError(
                f"case {case.name!r}: Lightning ran steps {sorted(scalars)}, the case has {last} (0..{last - 1})"
            )
        return RunRecord(_settings(callback.settings, case), scalars, sink.initial)


TRAINER = LightningTrainer()
