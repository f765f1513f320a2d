"""Settings differences before training (``verdict.training_settings``), through ``judge_run``:
the adapters and the precision are contract findings of their own; a plan difference is told by
the framework arguments that set it, or, when they agree, as the scheduler object itself."""

from __future__ import annotations

from typing import Any

from pytest_precalign.compare.tolerances import default_table
from pytest_precalign.reports.training_evidence_text import evidence_text
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import Adapter, RunRecord, TrainingPlan, TrainingSettings
from pytest_precalign.verdict.training_run import judge_run


def _plan(lr: list[float], **extra: Any) -> TrainingPlan:
    return TrainingPlan(
        optimizer="adamw",
        lr=tuple((v,) for v in lr),
        weight_decay=(0.0,),
        groups=(("w",),),
        **{"precision": "float32", "autocast": False, **extra},
    )


def _side(plan: TrainingPlan, adapters: tuple[Adapter, ...] = (), **arguments: Any) -> RunRecord:
    settings = TrainingSettings(
        trainer="hf_trainer",
        framework="transformers",
        framework_version="5",
        arguments={"TrainingArguments": {"lr_scheduler_type": "cosine", "learning_rate": 0.01, **arguments}},
        plan=plan,
        adapters=adapters,
    )
    scalars = {s: StepScalars(step=s, loss=1.0) for s in range(plan.steps)}
    return RunRecord(settings, scalars)


def _first(base: RunRecord, cand: RunRecord) -> tuple[int, str, str, str]:
    verdict = judge_run(base, cand, {}, default_table())
    assert verdict.first is not None
    first = verdict.first
    return first.step, first.what, first.origin, evidence_text(first.evidence)


def test_a_learning_rate_argument_names_the_lr_difference() -> None:
    step, what, origin, evidence = _first(
        _side(_plan([0.01, 0.01, 0.01])), _side(_plan([0.01, 0.01, 0.02]), learning_rate=0.02)
    )
    assert (step, what, origin) == (2, "settings", "lr")  # the plan's field, one name across frameworks
    assert evidence.endswith("learning_rate 0.01 vs 0.02: LR differs from step 2 (1.000e-02 vs 2.000e-02)")


def test_the_same_arguments_and_another_plan_is_the_scheduler_itself() -> None:
    step, what, origin, evidence = _first(_side(_plan([0.01, 0.01])), _side(_plan([0.01, 0.005])))
    assert (step, what, origin) == (1, "settings", "lr")
    assert "the transformers arguments that set the LR agree (lr_scheduler_type, learning_rate)" in evidence
    assert evidence.endswith("the scheduler object itself differs")


def test_an_adapter_on_one_side_only_is_named() -> None:
    lora = Adapter("default", "LORA", r=8, alpha=16.0, dropout=0.0, target_modules=("q_proj",))
    step, what, origin, evidence = _first(_side(_plan([0.01])), _side(_plan([0.01]), (lora,)))
    assert (step, what, origin) == (0, "settings", "adapters")
    assert (
        "PEFT adapter 'default' (peft_type LORA, r 8, lora_alpha 16, lora_dropout 0, target_modules [q_proj])"
        in (evidence)
    )
    assert evidence.endswith("only on the candidate")


def test_a_precision_without_framework_arguments_is_told_by_the_plans() -> None:
    base = _side(_plan([0.01]))
    cand = _side(_plan([0.01], precision="bfloat16", autocast=True))
    step, what, origin, evidence = _first(base, cand)
    assert (step, what, origin) == (0, "settings", "precision")
    assert evidence.endswith("precision float32 vs bfloat16 (autocast off vs on)")
