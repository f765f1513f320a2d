"""Record every optimizer step of a custom Accelerate loop, three lines added:

>>> steps = AccelerateSteps("runs/acc", accelerator, model, optimizer, scheduler=scheduler,
...                         total_steps=len(loader) // accumulation)         # added
>>> for batch in loader:
...     with accelerator.accumulate(model):
...         steps.micro_batch(batch)                                         # added
...         loss = model(**batch).loss
...         steps.backward(loss)              # instead of accelerator.backward(loss)
...         if accelerator.sync_gradients:
...             steps.clip_grad_norm_(model.parameters(), 1.0)  # instead of accelerator.clip_grad_norm_
...         optimizer.step()
...         scheduler.step()
...         optimizer.zero_grad()
>>> steps.close()                                                            # added

``steps.backward`` and ``steps.clip_grad_norm_`` call the accelerator's own and return what it
returns; they tell the recording the loss each backward runs on and the pre-clip grad norm
Accelerate reports. Each optimizer step ``s`` (0-based; ``start_step=`` for a resumed run;
``continues=FIRST_ROOT`` when it resumes into a new root: a compare joins it with its first
part, ``trace.run_parts``) is written as ``ROOT/step<s>/rank<R>/`` by a ``Recorder`` when the optimizer has stepped, in the
layout and with the scalars of ``PrecalignCallback`` (``optimizer_steps`` says how each is
measured); the first folder also holds the run's settings and plan (``"training"``) and, from
step 0, ``initial_params``. ``mode`` is a ``Recorder`` mode (``stats`` by default) or
``"scalars"``. Every recorder defaults to ``stats``; ``PrecalignCallback`` alone defaults to
``scalars`` (per-step scalars only, no hooks: cheap enough to leave on for a whole run).

- ``loss``: the sum over the step's micro-batches of ``loss / gradient_accumulation_steps`` --
  what ``accelerator.backward`` runs the backward on (a mean of micro-batch means);
  ``micro_batches``: the calls of ``steps.backward`` in the step.
- ``grad_norm``: the norm ``accelerator.clip_grad_norm_`` returned (before clipping, after
  unscaling); without a clip call, the grads' norm just before the update (``clip_coef`` 1).
- ``skipped``: the optimizer did not step (a mixed-precision overflow): the step is closed at
  the next micro-batch or at ``close()``.
- The plan: the optimizer's groups and each group's LR at each of ``total_steps`` steps from
  the run's own ``scheduler``, stepped as Accelerate's prepared scheduler steps it (once per
  process per update unless ``split_batches``) and put back exactly; ``clip_grad`` from the
  first ``clip_grad_norm_`` call; ``micro_batches`` from ``gradient_accumulation_steps``;
  precision from ``mixed_precision``. Without ``total_steps`` (or a scheduler whose LR
  depends on a metric) the plan has no LR schedule: ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..steps.optimizer_steps import OptimizerSteps, optimizer_arguments, parameter_names
from ..steps.run_settings import (
    adapters_of,
    frozen_parameters,
    gradient_checkpointing,
    optimizer_plan,
    planned_lrs,
)
from ..trace.step_scalars import StepScalars
from ..trace.training_record import TrainingSettings
from .recorder import Recorder
from .run_root import check_selected_steps

# accelerator.mixed_precision -> (what the forward computes in, by autocast); "no": the params'
MIXED_PRECISION = {"bf16": ("bfloat16", True), "fp16": ("float16", True)}
DTYPES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
}


class AccelerateSteps:
    """Record each optimizer step of an Accelerate loop (see the module doc)."""

    def __init__(
        self,
        root: str | Path,
        accelerator: Any,
        model: torch.nn.Module,
        optimizer: Any,
        *,
        scheduler: Any = None,
        total_steps: int | None = None,
        start_step: int = 0,
        mode: str = "stats",
        steps: Iterable[int] | None = None,
        continues: str | Path | None = None,
        **recorder: Any,
    ) -> None:
        for name, value in (("total_steps", total_steps), ("start_step", start_step)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ConfigError(f"AccelerateSteps: {name}= must be an integer >= 0, got {value!r}")
        inner = optimizer
        while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
            inner = inner.optimizer  # accelerate's AcceleratedOptimizer (a wrapper optimizer)
        if not isinstance(inner, torch.optim.Optimizer):
            raise ConfigError(
                f"AccelerateSteps: optimizer must be a torch optimizer or the one accelerator.prepare "
                f"returned, got {type(optimizer).__name__}"
            )
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"AccelerateSteps: model must be a torch module, got {type(model).__name__}")
        self.accelerator = accelerator
        self.scheduler = scheduler
        self.total_steps = total_steps
        self.model = accelerator.unwrap_model(model)
        self.recorder = Recorder(root, mode=mode, steps=steps, **recorder)
        if continues is not None:  # resumed into a new root: where its steps before start_step are
            self.recorder.seek(start_step, continues=continues)
        if isinstance(total_steps, int) and not isinstance(total_steps, bool):  # said before training
            check_selected_steps(self.recorder.steps, total_steps, "AccelerateSteps")
        self._steps = OptimizerSteps(
            self.recorder,
            self.model,
            inner,
            None,
            owner="AccelerateSteps",
            scaler=getattr(accelerator, "scaler", None),
        )
        self._next = start_step
        self._max_norm: float | None = None
        self._sync = False  # the last micro-batch was the step's last (accelerator.sync_gradients)
        self._planned = False  # the plan's LRs are made before the first update
        self._lrs: tuple[tuple[float, ...], ...] | None = None  # None: no plan
        self._post = inner.register_step_post_hook(self._updated)  # after the norms are taken

    @property
    def written(self) -> list[Path]:
        """The folders written so far, in order."""
        return self.recorder.written

    @property
    def scalars(self) -> dict[int, StepScalars]:
        """Each recorded step's scalars, by step."""
        return dict(self._steps.scalars)

    # -- the loop's calls -------------------------------------------------------------------
    def micro_batch(self, batch: Any) -> None:
        """A micro-batch is about to run (call it inside ``accelerator.accumulate``)."""
        if self._sync and self._steps.open_step is not None:
            self._close()  # the step before did not update (skipped)
        if not self._planned:
            self._lrs, self._planned = self._planned_lrs(), True
        self._steps.micro_batch(batch, self._next)
        self._sync = bool(self.accelerator.sync_gradients)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> Any:
        """``accelerator.backward(loss, **kwargs)``, the loss it runs on recorded."""
        if self._steps.open_step is None:
            raise ConfigError(
                "AccelerateSteps.backward: no micro-batch is open: call steps.micro_batch(batch) "
                "first, inside `with accelerator.accumulate(model):`"
            )
        self._steps.loss(loss.detach() / self.accelerator.gradient_accumulation_steps)
        return self.accelerator.backward(loss, **kwargs)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> Any:
        """``accelerator.clip_grad_norm_``; the pre-clip norm it returns is recorded."""
        norm = self.accelerator.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        if self._max_norm is None:
            self._max_norm = float(max_norm)
        if self._steps.open_step is not None:
            self._steps.before_clip(norm=None if norm is None else float(norm))
        return norm

    def close(self, failed: bool = False) -> None:
        """The loop is over: a step left without an update is written as skipped, hooks go.
        ``failed``: the loop raised inside its step: nothing of it is written (the run stopped
        inside it, its marker says so)."""
        if self._steps.open_step is not None and self._sync and not failed:
            self._close()
        self._post.remove()
        self._steps.remove(failed=failed)

    def __enter__(self) -> AccelerateSteps:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    # -- pieces -----------------------------------------------------------------------------
    def _updated(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._steps.open_step is not None:
            self._close()

    def _close(self) -> None:
        if not self._steps.micro_batches:
            step = self._steps.open_step
            self._steps.remove()
            raise ConfigError(
                f"AccelerateSteps: step {step} updated the model, but no loss went through "
                "steps.backward(loss): call it instead of accelerator.backward(loss)"
            )
        if self._steps.settings is None:
            self._steps.settings = self._settings()
        self._steps.close()
        self._next += 1

    def _settings(self) -> TrainingSettings:
        from importlib.metadata import version

        acc = self.accelerator
        optimizer = self._steps.optimizer
        precision, autocast = MIXED_PRECISION.get(str(acc.mixed_precision), (None, None))
        if str(acc.mixed_precision) == "no":
            dtypes = {p.dtype for p in self.model.parameters()}
            precision, autocast = (DTYPES.get(dtypes.pop()) if len(dtypes) == 1 else None), False
        inner, _ = _scheduler_of(self.scheduler, acc)
        arguments: dict[str, Any] = {
            "Accelerator": {
                "gradient_accumulation_steps": int(acc.gradient_accumulation_steps),
                "mixed_precision": str(acc.mixed_precision),
                "num_processes": int(acc.num_processes),
                "distributed_type": str(getattr(acc.distributed_type, "value", acc.distributed_type)),
                "split_batches": bool(getattr(acc, "split_batches", False)),
            },
            "optimizer": optimizer_arguments(optimizer),
            "lr_scheduler": None if inner is None else f"{type(inner).__module__}.{type(inner).__qualname__}",
            "clip_grad_norm": self._max_norm,
            "total_steps": self.total_steps,
        }
        plan = None
        if self._lrs is not None:
            plan = optimizer_plan(
                self.model,
                optimizer,
                self._lrs,
                names=parameter_names(optimizer, self.model),
                clip_grad=self._max_norm,
                micro_batches=int(acc.gradient_accumulation_steps),
                loss_normalisation="mean_of_micro_batch_means",
                precision=precision,
                autocast=autocast,
                gradient_checkpointing=gradient_checkpointing(self.model),
            )
        return TrainingSettings(
            trainer="accelerate",
            framework="accelerate",
            framework_version=version("accelerate"),
            arguments=arguments,
            plan=plan,
            adapters=adapters_of(self.model),
            frozen=frozen_parameters(self.model),
        )

    def _planned_lrs(self) -> tuple[tuple[float, ...], ...] | None:
        """Each group's LR at each of ``total_steps`` updates from the run's own scheduler,
        stepped as Accelerate steps it (None: no plan)."""
        inner, repeat = _scheduler_of(self.scheduler, self.accelerator)
        if not self.total_steps:
            return None

        def advance(step: int) -> None:
            for _ in range(repeat):
                total = getattr(inner, "total_steps", None)  # OneCycleLR: not past its end
                if total is None or inner._step_count <= total:
                    inner.step()

        optimizer = self._steps.optimizer
        schedulers = [] if inner is None else [inner]
        without = "pass AccelerateSteps(..., total_steps=None) to record without a plan"
        return planned_lrs([optimizer], schedulers, self.total_steps, advance, without=without)


def _scheduler_of(scheduler: Any, accelerator: Any) -> tuple[Any, int]:
    """The torch scheduler under ``scheduler`` and how many times it steps per update: a
    prepared one (``AcceleratedScheduler``) once per process unless ``split_batches``."""
    if scheduler is None:
        return None, 0
    inner = getattr(scheduler, "scheduler", None)
    if inner is None:
        return scheduler, 1
    if not getattr(scheduler, "step_with_optimizer", True) or getattr(scheduler, "split_batches", False):
        return inner, 1
    return inner, int(accelerator.num_processes)
