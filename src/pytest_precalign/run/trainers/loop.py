"""The tool's own loop (``training: loop``, and every case that takes no optimizer step):
each step's micro-batches through the model's forward and the case's loss, recorded, their
backward, then ``loop_step.LoopTraining``'s update (``torch.optim`` + ``lr_scheduler``, see
``loop_optimizer``), through the shared ``StepSkeleton``. On launched ranks
(``train_rank``): ``loop_ranks``, megatron-core's pipeline schedule with the case's torch
optimizer."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from ...config.launch import launched
from ...config.specs import CaseSpec, ModelSpec
from ...recording import HookRecorder
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from ...steps.run_settings import gradient_checkpointing
from ...trace.training_record import RunRecord, TrainingSettings
from .case_step import case_forward, shifted_tokens, split_micro_batches
from .loop_optimizer import loop_plan, param_groups
from .loop_step import LoopTraining
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
        groups = param_groups(model.module.named_parameters(), case.training.optimizer)
        return loop_plan(
            case.training.optimizer, groups, case.steps, checkpointing=gradient_checkpointing(model.module)
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
    micro = split_micro_batches(
        data.batch(step), case.training.optimizer.micro_batches if backward else 1, case
    )
    tokens = shifted_tokens(micro) if case.training.loss == "causal_lm" else None
    losses = []
    for call, part in enumerate(micro):
        loss = case_forward(
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
