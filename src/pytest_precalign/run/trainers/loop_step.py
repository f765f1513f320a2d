"""One optimizer step of the tool's own loop, with its evidence: micro-batches, the grads'
norm before clipping (``torch.nn.utils.get_total_norm``) then torch's own clipping with that
norm (``clip_grads_with_norm_``, which is ``clip_grad_norm_`` split in two), the LR the update
uses, ``optimizer.step()``, ``scheduler.step()``, and the step's ``StepScalars``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...config.specs import CaseSpec
from ...sources.inputs import CaseInputs
from ...steps.run_settings import gradient_checkpointing
from ...steps.step_evidence import StepEvidence, batch_hashes, group_settings, initial_params, token_count
from ...steps.torch_norms import clip_with_norm, total_norm
from ...trace.step_scalars import StepScalars
from ...trace.training_record import RunRecord
from .loop_optimizer import grouped_optimizer, loop_plan, make_scheduler, param_groups


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
        spec = case.training.optimizer
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
        norm = total_norm(grads, 2.0) if grads else torch.tensor(0.0)
        clip = self.spec.clip_grad if grads else None
        self.evidence.grads_before_clip(grads, norm=float(norm), zeros_after_clip=clip is not None)
        if clip is not None:
            clip_with_norm(self.params, clip, norm)
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
        digest, rows = batch_hashes(views)
        self.scalars[step] = self.evidence.finish(
            step,
            loss=None if total is None else float(total),
            lr=lr,
            weight_decay=wd,
            tokens=token_count(views),
            batch_hash=digest,
            rows_hash=rows,
            micro_batches=len(micro),
            skipped=False,
        )

    def run(self) -> RunRecord:
        """The side's run record: settings, scalars and initial parameters."""
        return RunRecord(self.settings, self.scalars, self.initial)
