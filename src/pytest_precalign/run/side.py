"""Drive one model through a case's steps with the recorder on: forward, loss, backward,
optimizer step. Shared by live cases, tensor-parallel ranks, the search and calibration."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..config.specs import CaseSpec, OptimizerSpec, RecordSpec
from ..errors import CaseError
from ..recording import HookRecorder
from ..recording.determinism import seed_everything
from ..recording.live_golden import Judge
from ..sources import LoadedModel
from ..sources.inputs import CaseInputs
from ..trace.records import Trace


def make_optimizer(spec: OptimizerSpec, params: Any) -> torch.optim.Optimizer:
    if spec.name == "adamw":
        return torch.optim.AdamW(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    if spec.name == "adam":
        return torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay
        )
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in float32, the same code on both sides."""
    shift_logits = logits[..., :-1, :].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].reshape(-1).to(shift_logits.device)
    return torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100)


def run_side(
    model: LoadedModel,
    inputs: CaseInputs,
    case: CaseSpec,
    manifest: Mapping[str, Any],
    seed: int,
    after_first_forward: Callable[[HookRecorder], None] | None = None,
    golden: Judge | None = None,
) -> Trace:
    """Record one model through the case's steps. ``after_first_forward`` runs once the
    forward of step 0 is recorded, before any backward or optimizer step (isolation mode
    calls the modules again there, with the weights they had). ``golden``: compare each
    record with a golden run while recording (``live_compare``)."""
    backward = "backward" in case.phases
    if backward and case.loss == "none":
        raise CaseError(f"case {case.name!r}: phase 'backward' needs a loss (loss: causal_lm or model)")
    device = next((p.device for p in model.module.parameters()), torch.device("cpu"))
    data = inputs.to(device)
    module = model.module
    modes = [(m, m.training) for m in module.modules()]  # the user's, restored after recording
    module.train(case.train)
    try:
        return _record_steps(model, data, case, manifest, seed, after_first_forward, golden)
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
) -> Trace:
    backward = "backward" in case.phases
    step_phase = "step" in case.phases
    module = model.module
    optimizer = make_optimizer(case.optimizer, module.parameters()) if step_phase else None
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
    )
    steps = case.steps if backward else 1
    with recorder:
        for step in range(steps):
            recorder.step = step
            seed_everything(seed + step)  # dropout, if any, draws the same numbers on both sides
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            with torch.set_grad_enabled(backward):
                output = model(data.model_inputs)
                logits = model.logits(output)
                logits_record = recorder.record_output("logits", logits)
                loss = _loss(model, output, logits, data, case)
                if loss is not None:
                    recorder.record_output("loss", loss, deps=(logits_record.id,))
            if step == 0 and after_first_forward is not None:
                with recorder.paused():
                    after_first_forward(recorder)
                recorder.calls.clear()
            if backward:
                assert loss is not None
                with model.context():  # a recomputing model re-runs its forward here
                    loss.backward()
            if optimizer is not None:
                optimizer.step()
                recorder.record_params()
            del output, logits, loss
    return recorder.trace(manifest)


def _loss(
    model: LoadedModel, output: Any, logits: torch.Tensor, data: CaseInputs, case: CaseSpec
) -> torch.Tensor | None:
    if case.loss == "none":
        return None
    if case.loss == "mean":
        return logits.float().mean()
    if case.loss == "model":
        loss = model.model_loss(output)
        if loss is None:
            raise CaseError(f"case {case.name!r}: loss: model, but model {model.name!r} returned no .loss")
        return loss
    if data.labels is None:
        if "backward" in case.phases:
            raise CaseError(f"case {case.name!r}: the causal_lm loss needs labels (inputs: {{labels: true}})")
        return None
    return causal_lm_loss(logits, data.labels)
