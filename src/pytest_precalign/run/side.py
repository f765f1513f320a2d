"""Drive one model through a case's steps with the recorder on: forward, loss, backward,
optimizer step. Shared by live cases, tensor-parallel ranks, the search and calibration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import Any

import torch

from ..config.specs import CaseSpec, RecordSpec
from ..errors import CaseError
from ..recording import HookRecorder
from ..recording.determinism import seed_everything
from ..recording.live_golden import Judge
from ..sources import LoadedModel
from ..sources.inputs import CaseInputs
from ..trace.records import Trace
from ..training.spec import Trainer
from .loop_step import LoopTraining, shifted_tokens, split_micro_batches
from .loop_training import make_optimizer as make_optimizer
from .step_boundary import Boundary


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy in float32, the same code on both sides."""
    shift_logits = logits[..., :-1, :].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].reshape(-1).to(shift_logits.device)
    return torch.nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=-100, reduction=reduction
    )


def run_side(
    model: LoadedModel,
    inputs: CaseInputs,
    case: CaseSpec,
    manifest: Mapping[str, Any],
    seed: int,
    after_first_forward: Callable[[HookRecorder], None] | None = None,
    golden: Judge | None = None,
    boundary: Boundary | None = None,
) -> Trace:
    """Record one model through the case's steps. ``after_first_forward`` runs once the
    forward of step 0 is recorded, before any backward or optimizer step (isolation mode
    calls the modules again there, with the weights they had). ``golden``: compare each
    record with a golden run while recording (``live_compare``). ``boundary``: record only
    its step, after the side's own machinery ran the steps before it (``step_boundary``)."""
    backward = "backward" in case.phases
    if backward and case.loss == "none":
        raise CaseError(f"case {case.name!r}: phase 'backward' needs a loss (loss: causal_lm or model)")
    device = next((p.device for p in model.module.parameters()), torch.device("cpu"))
    data = inputs.to(device)
    module = model.module
    modes = [(m, m.training) for m in module.modules()]  # the user's, restored after recording
    module.train(case.train)
    try:
        return _record_steps(model, data, case, manifest, seed, after_first_forward, golden, boundary)
    finally:
        for submodule, training in modes:
            submodule.training = training


def _record_steps(
    model: LoadedModel,
    data: CaseInputs,
    case: CaseSpec,
    manifest: Mapping[str, Any],
    seed: int,
    after_first_forward: Callable[[HookRecorder], None] | None,
    golden: Judge | None = None,
    boundary: Boundary | None = None,
) -> Trace:
    backward = "backward" in case.phases
    module = model.module
    trainer = side_trainer(case, manifest) if "step" in case.phases else "loop"
    training = LoopTraining.start(module, case) if "step" in case.phases and trainer == "loop" else None
    record: RecordSpec = case.record
    recorder = HookRecorder(
        module,
        mode=record.mode,
        inputs=record.inputs,
        grads=backward,
        include=record.include,
        exclude=record.exclude,
        keep_calls=after_first_forward is not None,
        level=record.level,
        golden=golden,
        # megatron: the grads the optimizer steps on (main_grad) exist once per step only
        param_grads="step" if trainer == "megatron" else "backward",
    )
    steps = case.steps if backward else 1
    if trainer != "loop":
        return _trainer_side(
            model, data, case, manifest, seed, recorder, after_first_forward, trainer, boundary
        )
    with recorder:
        for step in range(steps):
            if boundary is not None and boundary.past(step):
                break
            quiet = boundary is not None and boundary.quiet(step)
            with recorder.paused() if quiet else nullcontext():
                recorder.step = step
                seed_everything(seed + step)  # dropout, if any, draws the same numbers on both sides
                if boundary is not None and step == boundary.step:
                    boundary.at(model.module, None if training is None else training.optimizer)
                _loop_step(model, data, case, step, recorder, training, after_first_forward, quiet)
    extra = {} if training is None else training.manifest()
    return recorder.trace({**manifest, **extra})


def _loop_step(
    model: LoadedModel,
    data: CaseInputs,
    case: CaseSpec,
    step: int,
    recorder: HookRecorder,
    training: LoopTraining | None,
    after_first_forward: Callable[[HookRecorder], None] | None,
    quiet: bool = False,
) -> None:
    """One step of the tool's loop: its micro-batches' forward and backward, then the update
    (``quiet``: nothing recorded, the recorder paused by the caller)."""
    backward = "backward" in case.phases
    if training is not None:
        training.begin()
    micro = split_micro_batches(data.batch(step), case.optimizer.micro_batches if backward else 1, case)
    tokens = shifted_tokens(micro) if case.loss == "causal_lm" else None
    losses = []
    for call, part in enumerate(micro):
        loss = _forward(
            model, None if quiet else recorder, part, case, call, tokens if len(micro) > 1 else None
        )
        if step == 0 and call == 0 and after_first_forward is not None:
            with recorder.paused():
                after_first_forward(recorder)
            recorder.calls.clear()
        if backward:
            assert loss is not None
            with model.context():  # a recomputing model re-runs its forward here
                loss.backward()
        losses.append(None if loss is None else loss.detach())
        del loss
    if training is not None:
        training.update(step, losses, micro)
        if not quiet:
            recorder.record_params()


def _trainer_side(
    model: LoadedModel,
    data: CaseInputs,
    case: CaseSpec,
    manifest: Mapping[str, Any],
    seed: int,
    recorder: HookRecorder,
    after_first_forward: Callable[[HookRecorder], None] | None,
    trainer: Trainer,
    boundary: Boundary | None = None,
) -> Trace:
    """The side trained by a ``transformers.Trainer`` or megatron-core's own stack
    (``run/megatron_training.py``) while ``recorder`` records it."""
    from .hf_trainer import train_with_trainer
    from .megatron_training import train_with_megatron

    if after_first_forward is not None:
        raise CaseError(
            f"case {case.name!r}: isolation is not available with training: {trainer} "
            "(a Megatron model's default); set training: loop"
        )
    train = train_with_megatron if trainer == "megatron" else train_with_trainer
    with recorder:
        extra = train(model, data, case, recorder, seed, boundary)
    return recorder.trace({**manifest, **extra})


def side_trainer(case: CaseSpec, manifest: Mapping[str, Any]) -> Trainer:
    """How this side trains: ``training:`` for its side (``manifest["side"]``; the config
    fills in ``megatron`` for a Megatron model left out), else the loop (a side launched under
    torchrun: ``launch.launched_trainer``, which reads the same)."""
    side = manifest.get("side")
    chosen = getattr(case.training, side, None) if side in ("baseline", "candidate") else None
    return chosen if chosen in ("hf_trainer", "megatron") else "loop"


def _forward(
    model: LoadedModel,
    recorder: HookRecorder | None,
    data: CaseInputs,
    case: CaseSpec,
    call: int,
    step_tokens: int | None,
) -> torch.Tensor | None:
    """One micro-batch's forward and loss, recorded (call ``call`` of the step; nothing
    without ``recorder``). With ``step_tokens`` (micro-batches), the loss is normalised per
    token over the whole step."""
    with torch.set_grad_enabled("backward" in case.phases):
        output = model(data.model_inputs)
        logits = model.logits(output)
        logits_id = None if recorder is None else recorder.record_output("logits", logits, call=call).id
        loss = _loss(model, output, logits, data, case, step_tokens)
        if loss is not None and recorder is not None and logits_id is not None:
            recorder.record_output("loss", loss, deps=(logits_id,), call=call)
    return loss


def _loss(
    model: LoadedModel,
    output: Any,
    logits: torch.Tensor,
    data: CaseInputs,
    case: CaseSpec,
    step_tokens: int | None = None,
) -> torch.Tensor | None:
    if case.loss == "none":
        return None
    if case.loss == "mean":
        micro = case.optimizer.micro_batches if step_tokens is not None else 1
        return logits.float().mean() / micro if micro > 1 else logits.float().mean()
    if case.loss == "model":
        loss = model.model_loss(output)
        if loss is None:
            raise CaseError(f"case {case.name!r}: loss: model, but model {model.name!r} returned no .loss")
        if step_tokens is not None:  # the model's mean over this micro-batch's tokens, reweighted
            return loss * (shifted_tokens([data]) / max(1, step_tokens))
        return loss
    if data.labels is None:
        if "backward" in case.phases:
            raise CaseError(f"case {case.name!r}: the causal_lm loss needs labels (inputs: {{labels: true}})")
        return None
    if step_tokens is not None:
        return causal_lm_loss(logits, data.labels, reduction="sum") / max(1, step_tokens)
    return causal_lm_loss(logits, data.labels)
