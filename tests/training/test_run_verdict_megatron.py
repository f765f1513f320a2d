"""The training-run verdict on megatron-core's real stack (DDP, get_megatron_optimizer,
OptimizerParamScheduler; 10 steps of a tiny GPTModel): two sides' plans and per-step scalars
judged as a run. A clean rerun passes; a planted AdamW eps is optimizer_update at the first
step that updates; a decay horizon shortened by the warmup and weight decay on the norms are
contract differences named before step 0; a warmup one step behind (planted in the side's
scheduler, its plan untouched) is the schedule at step 1."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.megatron_core.megatron_stack import build_megatron_stack
from pytest_precalign.reports.run_pattern_text import pattern_text
from pytest_precalign.reports.training_evidence_text import evidence_text
from pytest_precalign.reports.training_text import downstream_text
from pytest_precalign.steps.spec import OptimizerSpec, ScheduleSpec
from pytest_precalign.trace.training_record import RunRecord
from pytest_precalign.verdict.training_run import TrainingVerdict, judge_run

from .megatron_tiny import logits_of, split, tiny_gpt, token_batches

STEPS = 10
SPEC = OptimizerSpec(
    lr=1e-2,
    weight_decay=0.1,
    schedule=ScheduleSpec(warmup_steps=2, decay="cosine", min_lr=1e-3),
    clip_grad=1.0,
)


def train(spec: OptimizerSpec = SPEC, plant: Any = None) -> RunRecord:
    stack = build_megatron_stack([tiny_gpt()], spec, STEPS, global_batch=4)
    settings = stack.training_manifest(STEPS, micro_batches=spec.micro_batches)
    if plant is not None:
        plant(stack)  # a bug in the side's machinery: its translated settings (the plan) still look right
    scalars = {}
    for step, batch in enumerate(token_batches(STEPS)):
        _, scalars[step] = stack.train_step(step, split(batch, spec.micro_batches), logits_of)
    return RunRecord(settings, scalars)


_BASELINE: list[RunRecord] = []


@pytest.fixture
def baseline(megatron_world: None) -> RunRecord:
    """The baseline's run, trained once for the module (plain data: plan and scalars)."""
    if not _BASELINE:
        _BASELINE.append(train())
    return _BASELINE[0]


def verdict(baseline: RunRecord, candidate: RunRecord) -> TrainingVerdict:
    return judge_run(baseline, candidate, {}, default_table())


def found(v: TrainingVerdict) -> tuple[int, str, str]:
    assert v.first is not None, f"aligned: {v.findings}"
    return v.first.step, v.first.what, v.first.origin


def test_a_clean_rerun_is_aligned_over_10_steps(baseline: RunRecord, megatron_world: None) -> None:
    v = verdict(baseline, train())
    assert v.passed and v.steps_compared == STEPS, (v.first, v.findings)


def test_a_planted_adamw_eps_is_the_optimizer_update_at_the_first_update(
    baseline: RunRecord, megatron_world: None
) -> None:
    def eps(stack: Any) -> None:
        for group in stack.optimizer.param_groups:
            group["eps"] = 1e-3

    v = verdict(baseline, train(plant=eps))
    # step 0 has LR 0 (warmup): the first update that moves anything is step 1
    assert found(v) == (1, "optimizer_update", "param_norm")
    assert downstream_text(v) == "steps 2-9 are downstream of it"


def test_a_warmup_one_step_behind_is_the_schedule_at_step_1(
    baseline: RunRecord, megatron_world: None
) -> None:
    def lag(stack: Any) -> None:
        original = stack.scheduler.step
        calls = {"n": 0}

        def step(increment: int) -> None:
            calls["n"] += 1
            original(increment=0 if calls["n"] == 1 else increment)  # the first advance is lost

        stack.scheduler.step = step

    v = verdict(baseline, train(plant=lag))
    assert found(v) == (1, "schedule", "lr[0]")
    assert v.first is not None and "lr at step 1: 5.000e-03 vs 0.000e+00" in evidence_text(v.first.evidence)


def test_a_decay_horizon_shortened_by_the_warmup_is_a_contract_difference(
    baseline: RunRecord, megatron_world: None
) -> None:
    short = OptimizerSpec(**{**SPEC.__dict__, "schedule": ScheduleSpec(2, "cosine", STEPS - 2, 1e-3)})
    v = verdict(baseline, train(short))
    step, what, origin = found(v)
    assert (what, origin) == ("settings", "lr") and step == 3
    assert v.first is not None and "the decay ends at step 8 vs after the last planned step" in pattern_text(
        v.first.pattern
    )


def test_weight_decay_on_the_norms_is_a_contract_difference_naming_a_norm(
    baseline: RunRecord, megatron_world: None
) -> None:
    v = verdict(baseline, train(OptimizerSpec(**{**SPEC.__dict__, "no_decay": ("*.bias",)})))
    assert found(v)[:2] == (0, "settings")
    assert (
        v.first is not None
        and "layernorm" in evidence_text(v.first.evidence)
        and ": 0 vs 0.1" in evidence_text(v.first.evidence)
    )
