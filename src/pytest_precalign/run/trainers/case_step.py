"""What every case trainer does with one micro-batch, shared by the loop, the Trainer, the
Lightning and the megatron-core trainers: the step's batch split into micro-batches
(``split_micro_batches``), the causal-LM loss's tokens (``shifted_tokens``) and loss
(``causal_lm_loss``), and the case's forward and loss of one micro-batch, recorded
(``case_forward``, ``case_loss``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...config.specs import CaseSpec
from ...errors import CaseError
from ...recording import HookRecorder
from ...sources import LoadedModel
from ...sources.inputs import CaseInputs


def split_micro_batches(batch: CaseInputs, count: int, case: CaseSpec) -> list[CaseInputs]:
    """``batch`` split into ``count`` equal micro-batches along dim 0 (tensors; other values
    are passed to each as they are)."""
    if count == 1:
        return [batch]
    sizes = {v.shape[0] for v in batch.model_inputs.values() if isinstance(v, torch.Tensor) and v.ndim}
    if batch.labels is not None:
        sizes.add(batch.labels.shape[0])
    if len(sizes) != 1 or next(iter(sizes)) % count:
        raise CaseError(
            f"case {case.name!r}: micro_batches {count} does not divide the step's batch "
            f"(dim 0 sizes {sorted(sizes)}): each step's batch is split into equal micro-batches"
        )
    rows = next(iter(sizes)) // count
    parts = []
    for k in range(count):
        cut = slice(k * rows, (k + 1) * rows)
        inputs = {
            name: value[cut] if isinstance(value, torch.Tensor) and value.ndim else value
            for name, value in batch.model_inputs.items()
        }
        parts.append(CaseInputs(inputs, None if batch.labels is None else batch.labels[cut]))
    return parts


def shifted_tokens(micro: Sequence[CaseInputs]) -> int:
    """The causal-LM loss's tokens over the step: label positions 1.. that are not -100."""
    return sum(int((m.labels[..., 1:] != -100).sum()) for m in micro if m.labels is not None)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy in float32, the same code on both sides."""
    shift_logits = logits[..., :-1, :].float().reshape(-1, logits.shape[-1])
    shift_labels = labels[..., 1:].reshape(-1).to(shift_logits.device)
    return torch.nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=-100, reduction=reduction
    )


def case_forward(
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
        loss = case_loss(model, output, logits, data, case, step_tokens)
        if loss is not None and recorder is not None and logits_id is not None:
            recorder.record_output("loss", loss, deps=(logits_id,), call=call)
    return loss


def case_loss(
    model: LoadedModel,
    output: Any,
    logits: torch.Tensor,
    data: CaseInputs,
    case: CaseSpec,
    step_tokens: int | None = None,
) -> torch.Tensor | None:
    """The case's loss of one micro-batch (``case.loss``; None: no loss); with
    ``step_tokens``, normalised per token over the whole step."""
    if case.training.loss == "none":
        return None
    if case.training.loss == "mean":
        micro = case.training.optimizer.micro_batches if step_tokens is not None else 1
        return logits.float().mean() / micro if micro > 1 else logits.float().mean()
    if case.training.loss == "model":
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
