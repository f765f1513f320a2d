"""A team's own training loop (plain SGD, one micro-batch a step, next-token loss), as a
precalign case trainer: ``plan`` says what it will do at every step before anything trains,
``train`` runs the case's steps through the ``StepSkeleton`` the case hands it (recorder step,
seed, parameter records) and returns its run record (settings, every step's scalars, the
initial parameters)."""

from __future__ import annotations

import torch

from pytest_precalign.steps.step_evidence import (
    StepEvidence,
    batch_hash,
    group_settings,
    initial_params,
    token_count,
)
from pytest_precalign.trace.training_record import RunRecord, TrainingPlan, TrainingSettings


def _settings(module, case):
    names = tuple(name for name, p in module.named_parameters() if p.requires_grad)
    lr = case.training.optimizer.lr
    plan = TrainingPlan(
        optimizer="sgd",
        lr=((lr,),) * case.steps,
        weight_decay=(0.0,),
        groups=(names,),
        momentum=0.0,
        micro_batches=1,
        loss_normalisation="per_token_over_step",
        precision="float32",
        autocast=False,
        gradient_checkpointing=False,
    )
    return TrainingSettings("company_loop", "torch", torch.__version__, {"optimizer": "SGD", "lr": lr}, plan)


def _loss(logits, labels):
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
    )


class CompanyLoop:
    def plan(self, model, spec, data, case, seed):
        return _settings(model.module, case)

    def train(self, model, data, case, steps):
        module, recorder = model.module, steps.recorder
        params = [p for p in module.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=case.training.optimizer.lr)
        initial, evidence, scalars = initial_params(module.named_parameters()), StepEvidence(params), {}
        for step in steps.steps(case.steps, module, lambda: optimizer):
            optimizer.zero_grad(set_to_none=True)
            evidence.begin()
            batch = data.batch(step)
            logits = module(**batch.model_inputs)
            loss = _loss(logits, batch.labels)
            if not steps.quiet:
                logits_id = recorder.record_output("logits", logits, call=0).id
                recorder.record_output("loss", loss, deps=(logits_id,), call=0)
            loss.backward()
            evidence.grads_before_clip()
            lr, wd = group_settings(optimizer)
            optimizer.step()
            steps.updated()
            view = [{"input_ids": batch.model_inputs["input_ids"], "labels": batch.labels}]
            scalars[step] = evidence.finish(
                step,
                loss=float(loss.detach()),
                lr=lr,
                weight_decay=wd,
                tokens=token_count(view),
                batch_hash=batch_hash(view),
                micro_batches=1,
                skipped=False,
            )
        return RunRecord(_settings(module, case), scalars, initial)


TRAINER = CompanyLoop()
