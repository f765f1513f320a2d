"""A launched side trained by the tool's loop (``training: loop`` under torchrun, and a
launched case that takes no optimizer step): on each rank, the case's steps through
megatron-core's pipeline schedule (``get_forward_backward_func``) with the case's torch
optimizer, each step recorded with the public ``Recorder`` into ``out/step<N>/rank<R>``. As
in Megatron's training loop, the schedule ends the backward with megatron-core's
``finalize_model_grads`` (``grad_sync``: e.g. the tensor-parallel all-reduce of q/k layernorm
grads), and parameter grads are recorded after it, as the optimizer sees them
(``param_grads="step"``)."""

from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...config.specs import CaseSpec
from ...errors import CaseError
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs
from .case_step import causal_lm_loss
from .loop_optimizer import grouped_optimizer, param_groups
from .skeleton import StepSkeleton


def run_steps(model: LoadedModel, inputs: CaseInputs, case: CaseSpec, steps: StepSkeleton, out: Path) -> None:
    """The case's steps through megatron-core's schedule, one recorded folder per step."""
    from ...training import Recorder, megatron_cpu
    from ..grad_sync import use_megatron_grad_finalization

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.pipeline_parallel import get_forward_backward_func

    backward = "backward" in case.phases
    if backward and case.training.loss not in ("causal_lm", "mean"):
        raise CaseError(
            f"case {case.name!r}: launched ranks compute loss causal_lm or mean, not {case.training.loss!r}"
        )
    module = model.module
    module.train(case.training.train)
    if backward:
        use_megatron_grad_finalization(module)
    groups = stage_param_groups(module, case.training.optimizer)
    optimizer = grouped_optimizer(case.training.optimizer, groups) if "step" in case.phases else None
    rec = Recorder(
        out,
        mode=case.record.mode,
        level=case.record.level,
        inputs=case.record.inputs,
        grads=backward,
        include=case.record.include,
        exclude=case.record.exclude,
        params="step" in case.phases,  # no optimizer step: no parameters to compare
        param_grads="step",  # after finalize_model_grads: the grads the optimizer steps on
    )
    data = inputs.to(next(module.parameters()).device)
    batch, seq = data.model_inputs["input_ids"].shape
    schedule = get_forward_backward_func()
    for step in steps.steps(case.steps if backward else 1, module):
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        rec.start(module)
        with megatron_cpu(), warnings.catch_warnings(), torch.set_grad_enabled(backward):
            warnings.simplefilter("ignore")
            schedule(
                forward_step_func=partial(_forward_step, model, rec, case),
                data_iterator=iter([data.batch(step)]),  # a new batch each step, as in-process
                model=[module],
                num_microbatches=1,
                seq_length=seq,
                micro_batch_size=batch,
                forward_only=not backward,
            )
        if backward:
            rec.grads_ready()
        if optimizer is not None:
            optimizer.step()
        rec.stop()
        rec.step()


def stage_param_groups(module: torch.nn.Module, spec: Any) -> Any:
    """The loop's parameter groups of this rank's stage (no decay on 1-d params, as in process),
    ``no_decay`` globs read in the model's global names: a stage's local layer 0 is global
    layer ``offset``."""
    from ...parallel.merge import globalize
    from ...steps.layout_probe import layer_offsets

    offsets = layer_offsets(module)
    named = [(globalize(name, offsets), param) for name, param in module.named_parameters()]
    return param_groups(named, spec)


def _forward_step(model: LoadedModel, rec: Any, case: CaseSpec, data_iterator: Any, module: Any) -> Any:
    data: CaseInputs = next(data_iterator)
    output = model(data.model_inputs)  # later stages take their input from the previous one
    return output, partial(_loss, rec, case, data)


def _loss(
    rec: Any, case: CaseSpec, data: CaseInputs, logits: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any]]:
    """On the last stage: the logits ([b, s, vocab]) and the loss, recorded as in-process.
    Expert-parallel ranks run the same batch, and each expert serves every rank's tokens: only
    the first rank's loss is back-propagated (the others' times 0), so an expert's grad is that
    of one batch, as Megatron's data-parallel averaging makes it; the merge keeps the first
    rank's records of everything but the other ranks' experts."""
    logits_record = rec.record_output("logits", logits)
    if case.training.loss == "mean":
        loss = logits.float().mean()
    elif case.training.loss == "causal_lm" and data.labels is not None:
        loss = causal_lm_loss(logits, data.labels)
    else:  # forward only, no loss recorded
        return logits.float().mean() * 0.0, {}
    deps = (logits_record.id,) if logits_record is not None else ()
    rec.record_output("loss", loss, deps)
    return (loss * 0.0 if _ep_rank() else loss), {"loss": loss.detach()}


def _ep_rank() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps

    return int(ps.get_expert_model_parallel_rank())
