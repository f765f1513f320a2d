"""One optimizer step of the tool's own loop, with its evidence: micro-batches, the grads'
norm before clipping (``torch.nn.utils.get_total_norm``) then torch's own clipping with that
norm (``clip_grads_with_norm_``, which is ``clip_grad_norm_`` split in two), the LR the update
uses, ``optimizer.step()``, ``scheduler.step()``, and the step's ``StepScalars``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...config.specs import CaseSpec
from ...errors import CaseError
from ...sources.inputs import CaseInputs
from ...trace.step_scalars import StepScalars
from ...trace.training_record import RunRecord
from ...training.run_settings import gradient_checkpointing
from ...training.step_evidence import StepEvidence, batch_hash, group_settings, initial_params, token_count
from .loop_optimizer import grouped_optimizer, loop_plan, make_scheduler, param_groups


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


def _batch_views(micro: Sequence[CaseInputs]) -> list[dict[str, Any]]:
    return [
        {
            "input_ids": m.model_inputs.get("input_ids"),
            "attention_mask": m.model_inputs.get("attention_mask"),
            "labels": m.labels,
        }
        for m in micro
    ]


class LoopTraining:
    """The loop's optimizer, scheduler and per-step evidence for one side of a case."""

    def __init__(self, module: torch.nn.Module, case: CaseSpec) -> None:
        spec = case.optimizer
        self.spec = spec
        self.groups = param_groups(module.named_parameters(), spec)
        self.params = [p for _, params, _ in self.groups for p in params]
        self.optimizer = grouped_optimizer(spec, self.groups)
        self.scheduler = make_scheduler(spec, self.optimizer, case.steps)
        self.settings = loop_plan(spec, self.groups, case.steps, checkpointing=gradient_checkpointing(module))
        self.initial = initial_params(module.named_parameters())
        self.evidence = StepEvidence(self.params)
        self.scalars: dict[int, StepScalars] = {}

    @classmethod
    def start(cls, module: torch.nn.Module, case: CaseSpec) -> LoopTraining:
        return cls(module, case)

    def begin(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.evidence.begin()

    def update(self, step: int, losses: Sequence[torch.Tensor | None], micro: Sequence[CaseInputs]) -> None:
        """Clip (when asked), step the optimizer and the scheduler, keep the step's scalars."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, 2.0) if grads else torch.tensor(0.0)
        clip = self.spec.clip_grad if grads else None
        self.evidence.grads_before_clip(grads, norm=float(norm), zeros_after_clip=clip is not None)
        if clip is not None:
            torch.nn.utils.clip_grads_with_norm_(self.params, clip, norm)
            self.evidence.grads_after_clip()
        lr, wd = group_settings(self.optimizer)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        total: torch.Tensor | None = None
        for loss in losses:
            if loss is not None:
                total = loss if total is None else total + loss
        views = _batch_views(micro)
        self.scalars[step] = self.evidence.finish(
            step,
            loss=None if total is None else float(total),
            lr=lr,
            weight_decay=wd,
            tokens=token_count(views),
            batch_hash=batch_hash(views),
            micro_batches=len(micro),
            skipped=False,
        )

    def run(self) -> RunRecord:
        """The side's run record: settings, scalars and initial parameters."""
        return RunRecord(self.settings, self.scalars, self.initial)
