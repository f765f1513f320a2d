"""Drive one model through a case's steps with the recorder on: the side's case trainer
(``run.trainers``, chosen by the case's ``training:``) runs forward, loss, backward and
optimizer step through the shared step skeleton.
Shared by live cases, the step replay, the search and calibration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config.specs import CaseSpec, RecordSpec
from ..errors import CaseError
from ..recording import HookRecorder
from ..recording.live_golden import Judge
from ..sources import LoadedModel
from ..sources.inputs import CaseInputs
from ..steps.trainer_registry import trainer_info, trainer_names
from ..trace.records import Trace
from .step_boundary import Boundary
from .trainers import case_trainer, checked_run_record, side_trainer
from .trainers.skeleton import StepSkeleton


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
    if backward and case.training.loss == "none":
        raise CaseError(f"case {case.name!r}: phase 'backward' needs a loss (loss: causal_lm or model)")
    device = next((p.device for p in model.module.parameters()), torch.device("cpu"))
    data = inputs.to(device)
    module = model.module
    modes = [(m, m.training) for m in module.modules()]  # the user's, restored after recording
    module.train(case.training.train)
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
    name = side_trainer(case, manifest.get("side"))
    info = trainer_info(name)
    if after_first_forward is not None and not info.isolation:
        able = ", ".join(n for n in trainer_names() if trainer_info(n).isolation)
        raise CaseError(
            f"case {case.name!r}: isolation is not available with training: {name} "
            f"({info.framework}); set training: {able}"
        )
    record: RecordSpec = case.record
    recorder = HookRecorder(
        model.module,
        mode=record.mode,
        inputs=record.inputs,
        grads="backward" in case.phases,
        include=record.include,
        exclude=record.exclude,
        keep_calls=after_first_forward is not None,
        level=record.level,
        golden=golden,
        param_grads=info.param_grads,  # e.g. megatron's main_grad exists once per step only
    )
    steps = StepSkeleton(recorder, seed, boundary, after_first_forward)
    with recorder:
        run = case_trainer(name).train(model, data, case, steps)
    if "step" in case.phases and "backward" in case.phases:
        run = checked_run_record(name, case, run, steps.count(case.steps))
    return recorder.trace(manifest).with_run(run)
