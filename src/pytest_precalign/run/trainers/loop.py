"""The tool's own loop (``training: loop``, and every case that takes no optimizer step):
each step's micro-batches through the model's forward and the case's loss, recorded, their
backward, then ``loop_step.LoopTraining``'s update (``torch.optim`` + ``lr_scheduler``, see
``loop_optimizer``), through the shared ``StepSkeleton``. On launched ranks
(``train_rank``): ``loop_ranks``, megatron-core's pipeline schedule with the case's torch
optimizer."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...config.launch import launched
from ...config.specs import CaseSpec, ModelSpec
from ...errors import CaseError
from ...recording import HookRecorder
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from ...trace.training_record import RunRecord, TrainingSettings
from ...training.run_settings import gradient_checkpointing
from .loop_optimizer import loop_plan, param_groups
from .loop_step import LoopTraining, causal_lm_loss, shifted_tokens, split_micro_batches
from .skeleton import StepSkeleton


class LoopTrainer:
    """``training: loop`` (``CaseTrainer``, launchable)."""

    def plan(
        self, model: LoadedModel, spec: ModelSpec, data: CaseInputs, case: CaseSpec, seed: int
    ) -> TrainingSettings | None:
        """``loop_plan`` over the side's own parameter groups (None for a launched side: its
        ranks step with ``torch.optim`` and write no plan)."""
        if launched(spec.options):
            return None
        groups = param_groups(model.module.named_parameters(), case.optimizer)
        return loop_plan(
            case.optimizer, groups, case.steps, checkpointing=gradient_checkpointing(model.module)
        )

    def train(self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton) -> RunRecord:
        recorder = steps.recorder
        assert recorder is not None
        training = LoopTraining.start(model.module, case) if "step" in case.phases else None
        count = case.steps if "backward" in case.phases else 1
        optimizer = None if training is None else training.optimizer
        for step in steps.steps(count, model.module, lambda: optimizer):
            _loop_step(model, data, case, step, recorder, training, steps)
        return RunRecord() if training is None else training.run()

    def train_rank(
        self, model: LoadedModel, data: CaseInputs, case: CaseSpec, steps: StepSkeleton, out: Path, rank: int
    ) -> None:
        from .loop_ranks import run_steps

        run_steps(model, data, case, steps, out)

    def launched_evidence(
        self, out: Path, nproc: int, full_weights: Mapping[str, torch.Tensor] | None
    ) -> RunRecord:
        """Nothing: the ranks' records are the evidence (no plan, no scalars)."""
        return RunRecord()


TRAINER = LoopTrainer()


def _loop_step(
    model: LoadedModel,
    data: CaseInputs,
    case: CaseSpec,
    step: int,
    recorder: HookRecorder,
    training: LoopTraining | None,
    steps: StepSkeleton,
) -> None:
    """One step of the tool's loop: its micro-batches' forward and backward, then the update
    (a quiet step: nothing recorded, the recorder paused by the skeleton)."""
    backward = "backward" in case.phases
    quiet = steps.quiet
    if training is not None:
        training.begin()
    micro = split_micro_batches(data.batch(step), case.optimizer.micro_batches if backward else 1, case)
    tokens = shifted_tokens(micro) if case.loss == "causal_lm" else None
    losses = []
    for call, part in enumerate(micro):
        loss = _forward(
            model, None if quiet else recorder, part, case, call, tokens if len(micro) > 1 else None
        )
        if step == 0 and call == 0 and steps.after_first_forward is not None:
            with recorder.paused():
                steps.after_first_forward(recorder)
            recorder.calls.clear()
        if backward:
            assert loss is not None
            with model.context():  # a recomputing model re-runs its forward here
                loss.backward()
        losses.append(None if loss is None else loss.detach())
        del loss
    if training is not None:
        training.update(step, losses, micro)
        steps.updated()


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
