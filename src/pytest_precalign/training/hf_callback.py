"""Record a ``transformers.Trainer`` run without subclassing anything:
``Trainer(..., callbacks=[PrecalignCallback("runs/hf", mode="stats")])``.

Each optimizer step ``s`` (``state.global_step`` before the update) is written as
``ROOT/step<s>/rank<R>/`` by a ``Recorder`` (the same layout as recording a loop by hand),
with the model's loss and logits per micro-batch and, in the manifest, the step's
``StepScalars``; the step-0 manifest also has ``initial_params`` (before any update).
``mode="scalars"`` adds no hooks at all and writes only the scalars (a few hundred bytes a
step); ``stats``/``tensor``/``hash`` record every layer on the steps ``steps=`` selects.

Where each scalar comes from (the Trainer's own numbers where it hands them out):

- ``loss`` and ``grad_norm`` (before clipping): the Trainer's ``on_log`` logs of the step. The
  callback asks for a log at every recorded step (``control.should_log``), which changes what
  is logged, never what is trained.
- ``clip_coef``, ``zero_grads``: the grads at ``on_pre_optimizer_step`` (after clipping);
  ``lr``/``weight_decay`` per group: the optimizer's groups there (the LR of this update);
  ``update_norm``/``param_norm``: at ``on_optimizer_step``.
- ``tokens``, ``batch_hash``: the ``input_ids``/``labels`` of each micro-batch, read by a
  forward pre-hook on the model (which never changes them).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..errors import ConfigError
from ..trace.step_scalars import StepScalars
from ..training.step_evidence import (
    StepEvidence,
    batch_hash,
    group_settings,
    initial_params,
    token_count,
)
from ..training.step_norms import grad_norm_and_zeros
from .recorder import Recorder


class TrainerUsageError(ConfigError):
    """A Trainer callback used where no Trainer calls it (or not as a Trainer does)."""


def _outside(what: str) -> TrainerUsageError:
    return TrainerUsageError(
        f"PrecalignCallback: {what}: it is a transformers.Trainer callback, called by the Trainer's "
        "training loop; pass it as Trainer(..., callbacks=[PrecalignCallback(ROOT)])"
    )


class TrainerSteps(TrainerCallback):
    """What every optimizer step of a Trainer run did; subclasses say where it goes
    (``_start``, ``_output``, ``_finish``)."""

    def __init__(self) -> None:
        self._model: torch.nn.Module | None = None
        self._handles: list[Any] = []
        self._evidence: StepEvidence | None = None
        self._views: list[dict[str, Any]] = []
        self._calls = 0
        self._pending: dict[str, Any] | None = None
        self.initial: dict[str, dict[str, float]] | None = None
        self.scalars: dict[int, StepScalars] = {}

    # -- the Trainer's events ---------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        model = kwargs.get("model")
        if not isinstance(model, torch.nn.Module):
            raise _outside("on_train_begin got no model")
        self._model = model
        self.initial = initial_params(model.named_parameters())
        self._handles = [
            model.register_forward_pre_hook(self._see_batch, with_kwargs=True),
            model.register_forward_hook(self._see_output),
        ]
        self._evidence = StepEvidence([p for p in model.parameters() if p.requires_grad])

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._model is None or self._evidence is None:
            raise _outside("on_step_begin before on_train_begin")
        self._views, self._calls = [], 0
        self._pending = {"step": state.global_step}
        self._start(self._model, state.global_step)
        self._evidence.begin()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        pending, evidence = self._pending, self._evidence
        if pending is None or evidence is None:
            raise _outside("on_pre_optimizer_step outside a step")
        grads = [p.grad for p in evidence.params if p.grad is not None]
        pending["after_clip"], pending["zero_grads"] = grad_norm_and_zeros(grads)
        pending["clipped"] = bool(args.max_grad_norm and args.max_grad_norm > 0)
        optimizer = kwargs.get("optimizer")
        if optimizer is not None:
            pending["lr"], pending["weight_decay"] = group_settings(optimizer)

    def on_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._pending is not None and self._evidence is not None:
            self._pending["update_norm"], self._pending["param_norm"] = self._evidence.norms_after_update()
            self._updated()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._pending is not None:
            control.should_log = True  # the Trainer hands out the step's loss and grad norm in on_log

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        pending, self._pending = self._pending, None
        if pending is None or logs is None or "loss" not in logs:
            if pending is not None:
                self._pending = pending
            return
        self._close_step(pending, logs)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- the step's pieces ------------------------------------------------------------------
    def _close_step(self, pending: dict[str, Any], logs: dict[str, float]) -> None:
        pre = logs.get("grad_norm")
        after = pending.get("after_clip")
        coef = None
        if pre is not None and after is not None:
            coef = (after / pre if pre > 0 else 1.0) if pending.get("clipped") else 1.0
        scalars = StepScalars(
            step=int(pending["step"]),
            loss=float(logs["loss"]),
            lr=pending.get("lr"),
            weight_decay=pending.get("weight_decay"),
            grad_norm=None if pre is None else float(pre),
            clip_coef=coef,
            update_norm=pending.get("update_norm"),
            param_norm=pending.get("param_norm"),
            zero_grads=pending.get("zero_grads"),
            skipped=False if "update_norm" in pending else None,
            tokens=token_count(self._views),
            batch_hash=batch_hash(self._views),
            micro_batches=self._calls,
        )
        self.scalars[scalars.step] = scalars
        self._finish(scalars)

    def _see_batch(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._pending is not None and torch.is_grad_enabled():
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._views.append({"input_ids": ids, "labels": kwargs.get("labels")})

    def _see_output(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._pending is None or not torch.is_grad_enabled():
            return
        call, self._calls = self._calls, self._calls + 1
        logits = getattr(output, "logits", None)
        loss = getattr(output, "loss", None)
        if isinstance(logits, torch.Tensor):
            self._output("logits", logits, call)
        if isinstance(loss, torch.Tensor):
            self._output("loss", loss, call)

    # -- where it goes (subclasses) ---------------------------------------------------------
    def _start(self, model: torch.nn.Module, step: int) -> None:
        """A step begins (before its first micro-batch)."""

    def _output(self, kind: str, tensor: torch.Tensor, call: int) -> None:
        """The model's logits or loss of micro-batch ``call``."""

    def _updated(self) -> None:
        """The optimizer updated the parameters (before the scheduler steps)."""

    def _finish(self, scalars: StepScalars) -> None:
        """The step ended and its scalars are known."""


class PrecalignCallback(TrainerSteps):
    """Record a ``transformers.Trainer`` run in the ``Recorder``'s layout (see module doc).
    ``mode``: ``"scalars"`` (default: per-step scalars only) or a ``Recorder`` mode (``stats``,
    ``tensor``, ``hash``: every layer too, on the ``steps`` selected); other keyword arguments
    go to the ``Recorder``."""

    def __init__(
        self, root: str | Path, *, mode: str = "scalars", steps: Iterable[int] | None = None, **recorder: Any
    ) -> None:
        super().__init__()
        self.recorder = Recorder(root, mode=mode, steps=steps, **recorder)

    @property
    def written(self) -> list[Path]:
        """The folders written so far, in order."""
        return self.recorder.written

    def _start(self, model: torch.nn.Module, step: int) -> None:
        self.recorder.seek(step)
        self.recorder.start(model)

    def _output(self, kind: str, tensor: torch.Tensor, call: int) -> None:
        self.recorder.record_output(kind, tensor)

    def _finish(self, scalars: StepScalars) -> None:
        if scalars.step == 0 and self.initial is not None:
            self.recorder.record_initial_params(self.initial)
        self.recorder.record_scalars(scalars)
        self.recorder.stop()
        self.recorder.step()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        super().on_train_end(args, state, control, **kwargs)
        self.recorder.close()
