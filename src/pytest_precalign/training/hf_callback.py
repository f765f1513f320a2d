"""Record a ``transformers.Trainer`` run without subclassing anything:
``Trainer(..., callbacks=[PrecalignCallback("runs/hf", mode="stats")])``.

Each optimizer step ``s`` (``state.global_step`` before the update) is written as
``ROOT/step<s>/rank<R>/`` by a ``Recorder`` (the same layout as recording a loop by hand),
with the model's loss and logits per micro-batch and, in the manifest, the step's
``StepScalars``; the step-0 manifest also has ``initial_params`` (before any update) and the
run's settings (``"training"``, ``steps.run_settings``): the Trainer's own arguments (the
``TrainingArguments`` or TRL config class and its fields), each PEFT adapter, the frozen
parameters and the plan -- every group's LR at every step up to ``max_steps`` from the run's
own ``lr_scheduler`` (stepped and put back exactly before step 0; ``plan=False`` skips it), the
groups' weight decay, clipping (``max_grad_norm``), accumulation, the loss normalisation (per
token over the step when the model takes ``num_items_in_batch``, as the Trainer decides), the
precision the forward really ran in (autocast seen inside the model's first forward: TRL's
``SFTConfig`` has ``bf16=True`` by default, and accelerate autocasts on CPU too), gradient
checkpointing and the attention implementation. Every manifest's ``dtype`` is that precision.
Parameter names are the records' (a PEFT model's ``base_model.model.`` is not part of them).

TRL's trainers compute the loss with a fused LM head that never builds the logits: the model
returns the per-token ``log_probs`` of the labels, recorded under that name (a ``logits``-kind
record, the forward's output before the loss).
``mode="scalars"`` adds no hooks at all and writes only the scalars (a few hundred bytes a
step); ``stats``/``tensor``/``hash`` record every layer on the steps ``steps=`` selects.

Where each scalar comes from (the Trainer's own numbers where it hands them out):

- ``loss`` and ``grad_norm`` (before clipping): the Trainer's ``on_log`` logs of the step (the
  loss NaN or infinite when a micro-batch's own loss was: ``step_loss``). The
  callback asks for a log at every recorded step (``control.should_log``), which changes what
  is logged, never what is trained.
- ``clip_coef``, ``zero_grads``: the grads at ``on_pre_optimizer_step`` (after clipping);
  ``lr``/``weight_decay`` per group: the optimizer's groups there (the LR of this update);
  ``update_norm``/``param_norm``: at ``on_optimizer_step``.
- ``tokens``, ``batch_hash``: the ``input_ids``/``labels`` of each micro-batch, read by a
  forward pre-hook on the model (which never changes them).

Where the optimizer and scheduler come from: the Trainer hands them to callbacks up to
transformers 4.48; from 4.49 on its callback handler keeps the ``None`` it was built with
(transformers issue #38181) while the Trainer holds them as ``trainer.optimizer`` and
``trainer.lr_scheduler``. The callback then takes them from the Trainer whose training loop
called it (found on the call stack, read only). A run where neither gives an optimizer is
recorded without plan, LR and weight decay, and says so: one warning at ``on_train_begin``,
and the manifest's ``training.plan_missing``, which every compare repeats.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

try:
    from transformers.trainer_callback import ExportableState
except ImportError:  # older transformers (4.39 has none; 4.41 has it), below the hf extra's range

    class ExportableState:  # type: ignore[no-redef]
        """Stands in where transformers keeps no callback state in its checkpoints: a run resumed
        into a new root there points to its first part only when given ``continues=``."""


from ..errors import ConfigError
from ..recording.compiled import hook_wrapper
from ..steps.run_settings import forward_precision, named_parameters, trainer_settings, with_precision
from ..steps.step_evidence import (
    StepEvidence,
    batch_hashes,
    group_settings,
    initial_params,
    token_count,
)
from ..steps.step_norms import grad_norm_and_zeros
from ..steps.step_sink import StepSink
from ..steps.unwrap import unwrap
from ..trace.step_scalars import StepScalars
from ..trace.training_record import TrainingSettings
from .recorder import Recorder
from .resumed_parts import PART_KEY, continue_recording, json_args, run_part, stored_root
from .run_root import check_selected_steps


def step_loss(logged: float, computed: float | None) -> float:
    """The step's loss as recorded: the Trainer's logged one, unless a micro-batch's own loss
    was NaN or infinite (``computed``): the Trainer's ``logging_nan_inf_filter`` (on by
    default) logs a finite stand-in then, and a recording says what the step computed."""
    return computed if computed is not None and math.isfinite(logged) else logged


class TrainerUsageError(ConfigError):
    """A Trainer callback used where no Trainer calls it (or not as a Trainer does)."""


def _outside(what: str) -> TrainerUsageError:
    return TrainerUsageError(
        f"PrecalignCallback: {what}: it is a transformers.Trainer callback, called by the Trainer's "
        "training loop; pass it as Trainer(..., callbacks=[PrecalignCallback(ROOT)])"
    )


# How far up the call stack the Trainer's training loop is looked for: the callback's own
# method, CallbackHandler.call_event, CallbackHandler.on_<event>, then the loop (a subclass
# or a wrapper adds a few).
_STACK_DEPTH = 12


def calling_trainer() -> Any:
    """The ``transformers.Trainer`` (or subclass) whose method is on the call stack, or None."""
    from transformers import Trainer

    frame: FrameType | None = sys._getframe(1)
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def optimizer_and_scheduler(kwargs: Mapping[str, Any]) -> tuple[Any, Any, str]:
    """The run's optimizer and scheduler as the event hands them out, else the calling
    Trainer's (transformers >= 4.49 hands callbacks ``None``); and where they came from."""
    optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
    if optimizer is not None:
        return optimizer, scheduler, "the event's arguments"
    trainer = calling_trainer()
    if trainer is None:
        return None, None, "no Trainer on the call stack"
    return getattr(trainer, "optimizer", None), getattr(trainer, "lr_scheduler", None), "the Trainer"


class TrainerSteps(TrainerCallback):
    """What every optimizer step of a Trainer run did, written into ``sink`` (a ``StepSink``:
    ``PrecalignCallback``'s ``Recorder``, or the tool's Trainer case's sink,
    ``run/trainers/hf_trainer.py``); the run's ``settings`` (with the ``precision`` its
    forward ran in) are written with step 0 when known."""

    def __init__(self, sink: StepSink) -> None:
        self.sink = sink
        self.settings: TrainingSettings | None = None
        self.precision: tuple[str, bool] | None = None  # (dtype, autocast) the first forward ran in
        self._model: torch.nn.Module | None = None
        self._handles: list[Any] = []
        self._evidence: StepEvidence | None = None
        self._views: list[dict[str, Any]] = []
        self._calls = 0
        self._pending: dict[str, Any] | None = None
        self._optimizer: Any = None  # the run's, from on_train_begin (see the module doc)
        self._scheduler: Any = None
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
        self._optimizer, self._scheduler, _ = optimizer_and_scheduler(kwargs)
        self.initial = initial_params(named_parameters(model))
        # TrainingArguments(torch_compile=True): the Trainer compiles the model's call, root hooks
        # included; these read real tensors (the batch's hash, the loss), so they run outside
        # the compiled graph (at its two ends: the model's graph is not split)
        wrap = hook_wrapper(model, compiled=bool(getattr(args, "torch_compile", False)))
        self._handles = [
            model.register_forward_pre_hook(wrap(self._see_batch), with_kwargs=True),
            model.register_forward_hook(wrap(self._see_output)),
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
        optimizer = kwargs.get("optimizer") or self._optimizer
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
        self.sink.close()

    # -- the step's pieces ------------------------------------------------------------------
    def _close_step(self, pending: dict[str, Any], logs: dict[str, float]) -> None:
        losses = pending.pop("losses", [])
        if losses:  # one sync a step, where the Trainer's own log syncs too
            total = torch.stack(losses).sum()
            if not bool(torch.isfinite(total)):
                pending["bad_loss"] = float(total)
        pre = logs.get("grad_norm")
        after = pending.get("after_clip")
        coef = None
        if pre is not None and after is not None:
            coef = (after / pre if pre > 0 else 1.0) if pending.get("clipped") else 1.0
        hashes = batch_hashes(self._views)
        scalars = StepScalars(
            step=int(pending["step"]),
            loss=step_loss(float(logs["loss"]), pending.get("bad_loss")),
            lr=pending.get("lr"),
            weight_decay=pending.get("weight_decay"),
            grad_norm=None if pre is None else float(pre),
            clip_coef=coef,
            update_norm=pending.get("update_norm"),
            param_norm=pending.get("param_norm"),
            zero_grads=pending.get("zero_grads"),
            skipped=False if "update_norm" in pending else None,
            tokens=token_count(self._views),
            batch_hash=hashes[0],
            rows_hash=hashes[1],
            micro_batches=self._calls,
        )
        self.scalars[scalars.step] = scalars
        self._finish(scalars)

    def _see_batch(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._pending is not None and torch.is_grad_enabled():
            ids = kwargs.get("input_ids", args[0] if args else None)
            self._views.append({"input_ids": ids, **{k: kwargs.get(k) for k in ("labels", "attention_mask")}})

    def _see_output(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._pending is None or not torch.is_grad_enabled():
            return
        call, self._calls = self._calls, self._calls + 1
        logits = getattr(output, "logits", None)
        loss = getattr(output, "loss", None)
        if isinstance(logits, torch.Tensor):
            self._output("logits", logits, call)
        elif isinstance(getattr(output, "log_probs", None), torch.Tensor):  # TRL's fused LM head
            self._output("log_probs", output.log_probs, call)
        if isinstance(loss, torch.Tensor):
            self._output("loss", loss, call)
            self._see_loss(loss)

    def _see_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's own loss, kept as a tensor (no sync here; read at the step's end)."""
        if self._pending is not None:
            self._pending.setdefault("losses", []).append(loss.detach().float().sum())

    # -- into the sink ----------------------------------------------------------------------
    def _start(self, model: torch.nn.Module, step: int) -> None:
        """A step begins (before its first micro-batch)."""
        self.sink.seek(step)
        self.sink.start(model)

    def _output(self, kind: str, tensor: torch.Tensor, call: int) -> None:
        """The model's logits (or TRL's ``log_probs``) or loss of micro-batch ``call``."""
        if kind == "log_probs":
            self.sink.record_output("logits", tensor, name="log_probs", call=call)
        else:
            self.sink.record_output(kind, tensor, call=call)

    def _updated(self) -> None:
        """The optimizer updated the parameters (before the scheduler steps)."""
        self.sink.updated()

    def _finish(self, scalars: StepScalars) -> None:
        """The step ended and its scalars are known."""
        if scalars.step == 0 and self.settings is not None:
            settings = self.settings
            if self.precision is not None:
                settings = with_precision(settings, *self.precision)
            self.sink.write_settings(settings)
        if scalars.step == 0 and self.initial is not None:
            self.sink.record_initial_params(self.initial)
        self.sink.record_scalars(scalars)
        self.sink.stop()
        self.sink.step()


class PrecalignCallback(TrainerSteps, ExportableState):
    """Record a ``transformers.Trainer`` run in the ``Recorder``'s layout (see module doc).
    ``mode``: ``"scalars"`` (default: per-step scalars only) or a ``Recorder`` mode (``stats``,
    ``tensor``, ``hash``: every layer too, on the ``steps`` selected); other keyword arguments
    go to the ``Recorder``; ``plan=False``: write the settings without the LR plan (the
    scheduler is then never touched). Every recorder defaults to ``stats``;
    ``PrecalignCallback`` alone defaults to ``scalars`` (per-step scalars only, no hooks: cheap
    enough to leave on for a whole run).

    Each checkpoint keeps the root and run id (a stateful callback: ``trainer_state.json``'s
    ``stateful_callbacks``); a run resumed from it into a new root points to its first part
    and compares as one run with it (``resumed_parts``). ``continues``: the first part's root,
    when it is no longer where the checkpoint says."""

    def __init__(
        self,
        root: str | Path,
        *,
        mode: str = "scalars",
        steps: Iterable[int] | None = None,
        plan: bool = True,
        continues: str | Path | None = None,
        **recorder: Any,
    ) -> None:
        self.recorder = Recorder(root, mode=mode, steps=steps, **recorder)
        super().__init__(self.recorder)  # the run's settings and precision: known at on_train_begin
        self.continues = continues
        self._args = json_args(
            root=root, mode=mode, steps=self.recorder.steps, plan=plan, continues=continues, **recorder
        )
        setattr(self, PART_KEY, None)  # what the checkpoint resumed from kept (transformers may set it)
        self.plan = plan
        self._probes: list[Any] = []

    @property
    def written(self) -> list[Path]:
        """The folders written so far, in order."""
        return self.recorder.written

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        check_selected_steps(
            self.recorder.steps, int(state.max_steps), "PrecalignCallback"
        )  # before training
        super().on_train_begin(args, state, control, **kwargs)
        model = kwargs["model"]
        if state.global_step > 0:
            self._resumed(state)
        if state.global_step == 0:  # a resumed run has no step 0 to write them in
            import transformers

            self.settings = trainer_settings(
                args,
                model,
                self._optimizer,
                self._scheduler,
                int(state.max_steps),
                framework=("transformers", transformers.__version__),
                plan=self.plan,
            )
            if self.plan and self._optimizer is None:
                self.settings = self._without_plan(self.settings, transformers.__version__)
        # accelerate autocasts inside the model's (patched) forward: seen from its submodules
        unwrapped, _ = unwrap(model)
        compiled = bool(getattr(args, "torch_compile", False))
        self.recorder.compiled = compiled  # the Trainer compiles a model the callback sees bare
        if compiled:  # a probe inside the compiled graph would split it: the precision asked for
            mixed = "bfloat16" if args.bf16 else "float16" if args.fp16 else None
            self.precision = (mixed, True) if mixed else (forward_precision(model), False)
            return
        self._probes = [c.register_forward_pre_hook(self._see_precision) for c in unwrapped.children()]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (transformers' ``ExportableState``): the arguments, and
        where this run records (``resumed_parts.run_part``)."""
        return {
            "args": self._args,
            "attributes": {PART_KEY: run_part(self.recorder, getattr(self, PART_KEY))},
        }

    def _resumed(self, state: TrainerState) -> None:
        """A run resumed at ``state.global_step``: continue the recording (``resumed_parts``)."""
        name = type(self).__name__
        held: Any = getattr(state, "stateful_callbacks", None)  # a dict once loaded from trainer_state.json
        stored = held.get(name) if isinstance(held, dict) else None
        stored = stored[0] if isinstance(stored, list) and stored else stored
        part = stored.get("attributes", {}).get(PART_KEY) if isinstance(stored, dict) else None
        setattr(self, PART_KEY, part if isinstance(part, dict) else None)
        continue_recording(self.recorder, int(state.global_step), stored_root(part), self.continues, name)
        if isinstance(held, dict):  # a checkpoint saved without the callback: transformers' save
            held.setdefault(name, self.state())  # looks the key up

    @staticmethod
    def _without_plan(settings: TrainingSettings, version: str) -> TrainingSettings:
        """The settings of a run whose optimizer the callback could not reach, saying so."""
        why = (
            f"PrecalignCallback got no optimizer from the Trainer (transformers {version}: neither "
            "the event's arguments nor the calling Trainer had one), so no plan, LR or weight decay "
            "was recorded"
        )
        warnings.warn(why, RuntimeWarning, stacklevel=3)
        return dataclasses.replace(settings, plan_missing=why)

    def _see_precision(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self.precision is not None or self._pending is None or not torch.is_grad_enabled():
            return
        param = next(module.parameters(), None)
        device = param.device.type if param is not None else "cpu"
        if torch.is_autocast_enabled(device):
            dtype = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
            self.precision = (dtype, True)
        elif self._model is not None:
            self.precision = (forward_precision(self._model), False)
        for probe in self._probes:
            probe.remove()
        self._probes = []

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        super().on_train_end(args, state, control, **kwargs)
        for probe in self._probes:
            probe.remove()
        self._probes = []
