"""A side trained by megatron-core's own stack (``training: megatron``, the default for a
``source: megatron`` model): ``training.megatron_stack`` (DDP, ``get_megatron_optimizer``,
``OptimizerParamScheduler``, ``finalize_model_grads``, the pipeline schedule) through the case's
steps, each step's batch split into ``optimizer.micro_batches`` micro-batches, every layer
recorded by the case's hooks and every step's ``StepScalars`` kept. Returns what the side's
manifest gains: ``training`` (megatron-core's arguments and plan), ``scalars``,
``initial_params``.

The recorder must be made with ``param_grads="step"``: Megatron's DDP accumulates each
micro-batch's grad into ``main_grad`` and ``finalize_model_grads`` divides the sum by the step's
tokens, so the grads the optimizer steps on exist only after the schedule; they are recorded
then (``main_grad``), as the other frameworks' accumulated grads are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..config.specs import CaseSpec
from ..errors import CaseError
from ..recording import HookRecorder
from ..recording.determinism import seed_everything
from ..sources import LoadedModel
from ..sources.inputs import CaseInputs
from ..trace.step_scalars import SCALARS_KEY, StepScalars, scalars_manifest
from ..training.megatron_stack import build_megatron_stack
from ..training.step_evidence import initial_params


def micro_batches(batch: CaseInputs, count: int, case: CaseSpec) -> list[dict[str, torch.Tensor]]:
    """``batch`` as ``count`` equal micro-batches along dim 0 (``labels`` included)."""
    if batch.labels is None:
        raise CaseError(f"case {case.name!r}: training: megatron needs labels (inputs: {{labels: true}})")
    tensors = {k: v for k, v in batch.model_inputs.items() if isinstance(v, torch.Tensor)}
    tensors["labels"] = batch.labels
    rows = int(batch.labels.shape[0])
    if rows % count:
        raise CaseError(f"case {case.name!r}: micro_batches {count} does not divide the batch of {rows} rows")
    parts = {k: v.chunk(count) for k, v in tensors.items()}
    return [{k: v[i] for k, v in parts.items()} for i in range(count)]


def train_with_megatron(
    model: LoadedModel, data: CaseInputs, case: CaseSpec, recorder: HookRecorder, seed: int
) -> dict[str, Any]:
    """Train ``model`` (a megatron-core module of this process) through the case's steps while
    ``recorder`` (entered, ``param_grads="step"``) records; the manifest's training evidence."""
    if case.loss != "causal_lm":
        raise CaseError(f"case {case.name!r}: training: megatron computes loss causal_lm, not {case.loss!r}")
    if recorder.param_grads != "step":
        raise CaseError(f"case {case.name!r}: training: megatron records grads at param_grads='step'")
    module = model.module
    spec = case.optimizer
    first = data.batch(0)
    rows = int(next(v for v in first.model_inputs.values() if isinstance(v, torch.Tensor)).shape[0])
    initial = initial_params(module.named_parameters())
    stack = build_megatron_stack([module], spec, case.steps, global_batch=rows)
    training = stack.training_manifest(case.steps, spec.micro_batches)

    def forward(chunk: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
        return model.logits(model({k: v for k, v in batch.items() if k != "labels"}))

    def on_output(kind: str, tensor: torch.Tensor) -> None:
        recorder.record_output("logits" if kind == "logits" else "loss", tensor)

    scalars: dict[int, StepScalars] = {}
    for step in range(case.steps):
        recorder.step = step
        seed_everything(seed + step)  # dropout, if any, draws as on the other side
        parts = micro_batches(data.batch(step), spec.micro_batches, case)
        _, scalars[step] = stack.train_step(
            step, parts, forward, on_output=on_output, grads_ready=recorder.record_param_grads
        )
        recorder.record_params()
    return {"training": training, SCALARS_KEY: scalars_manifest(scalars), "initial_params": initial}
