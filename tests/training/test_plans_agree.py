"""Every trainer's plan of one clean case agrees with every other's: the tool's loop, a real
``transformers.Trainer``, megatron-core's stack and PyTorch Lightning's loop, each planning the same spec (SGD with
momentum, Adam, AdamW; a warmup + cosine schedule, clipping, weight decay, 2 micro-batches)
over the same tiny megatron-core model, with their own plan functions, in process. Each plan
fills every field its optimizer has (SGD: momentum, no betas / eps; Adam and AdamW: betas and
eps, no momentum), so the contract compares them all and lists nothing as unsaid."""

from __future__ import annotations

from dataclasses import fields, replace
from itertools import combinations
from typing import Any

import pytest
import torch

from pytest_precalign.config.specs import CaseSpec, Models, ModelSpec, RecordSpec, TrainingSpec
from pytest_precalign.run.trainers import case_trainer
from pytest_precalign.sources import LoadedModel
from pytest_precalign.sources.inputs import CaseInputs
from pytest_precalign.steps.spec import OptimizerSpec, ScheduleSpec
from pytest_precalign.trace.training_record import TrainingPlan, TrainingSettings
from pytest_precalign.verdict.training_contract import check_contract, unsaid_settings

from .megatron_tiny import SEQ, VOCAB, tiny_gpt

STEPS = 6
SCHEDULE = ScheduleSpec(warmup_steps=2, decay="cosine", min_lr=1e-3)
SPECS = {
    "sgd": OptimizerSpec(name="sgd", lr=1e-2, momentum=0.9, weight_decay=0.1, schedule=SCHEDULE,
                         clip_grad=1.0, micro_batches=2),
    "adam": OptimizerSpec(name="adam", lr=1e-2, betas=(0.9, 0.95), eps=1e-7, weight_decay=0.1,
                          schedule=SCHEDULE, clip_grad=1.0, micro_batches=2),
    "adamw": OptimizerSpec(name="adamw", lr=1e-2, betas=(0.9, 0.95), eps=1e-7, weight_decay=0.1,
                           schedule=SCHEDULE, clip_grad=1.0, micro_batches=2),
}  # fmt: skip
TRAINERS = ("loop", "hf_trainer", "megatron", "lightning")
PAIRS = list(combinations(TRAINERS, 2))


def _case(spec: OptimizerSpec) -> CaseSpec:
    return CaseSpec(
        name="plans", sides=Models("a", "b"), inputs="toks", phases=("forward", "backward", "step"),
        steps=STEPS, sync_weights=False, strict_weights=True, mapping=None,
        training=TrainingSpec(spec, loss="causal_lm", train=True),
        record=RecordSpec(), tolerances=None, expect=None, where="plans",
    )  # fmt: skip


def _plans(spec: OptimizerSpec) -> dict[str, TrainingSettings]:
    case = _case(spec)
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(0))
    data = CaseInputs({"input_ids": ids}, ids.clone())
    side = ModelSpec("tiny", "megatron", {}, "cpu", "float32", 0, None, "plans")
    out: dict[str, TrainingSettings] = {}
    for trainer in TRAINERS:
        model = LoadedModel("tiny", tiny_gpt(), None)
        plan = case_trainer(trainer).plan(model, side, data, case, 0)  # each trainer's own plan
        assert plan is not None
        out[trainer] = plan
    return out


@pytest.fixture(scope="module")
def plans() -> Any:
    """Each optimizer's four plans (one megatron world for the module's tests)."""
    pytest.importorskip("megatron.core")
    pytest.importorskip("accelerate")
    pytest.importorskip("lightning")
    from .megatron_tiny import megatron_world

    world = megatron_world()
    next(world)
    try:
        yield {name: _plans(spec) for name, spec in SPECS.items()}
    finally:
        world.close()


@pytest.mark.parametrize("optimizer", list(SPECS))
@pytest.mark.parametrize(("baseline", "candidate"), PAIRS)
def test_a_clean_case_plans_the_same_on_every_pair_of_trainers(
    plans: dict[str, dict[str, TrainingSettings]], optimizer: str, baseline: str, candidate: str
) -> None:
    base, cand = plans[optimizer][baseline].plan, plans[optimizer][candidate].plan
    assert base is not None and cand is not None
    assert check_contract(base, cand) is None, check_contract(base, cand)
    assert unsaid_settings(base, cand) == ()


@pytest.mark.parametrize("optimizer", list(SPECS))
def test_every_trainer_fills_every_field_its_optimizer_has(
    plans: dict[str, dict[str, TrainingSettings]], optimizer: str
) -> None:
    sgd = optimizer == "sgd"
    for trainer, settings in plans[optimizer].items():
        plan = settings.plan
        assert plan is not None, trainer
        unset = {f.name for f in fields(TrainingPlan) if getattr(plan, f.name) is None}
        assert unset == ({"betas", "eps"} if sgd else {"momentum"}), (trainer, unset)
        assert plan.optimizer == optimizer and plan.steps == STEPS, trainer
        assert plan.momentum == (0.9 if sgd else None) and plan.betas == (None if sgd else (0.9, 0.95))
        assert (plan.precision, plan.autocast, plan.gradient_checkpointing) == ("float32", False, False)
        assert (plan.clip_grad, plan.micro_batches) == (1.0, 2)
        assert plan.loss_normalisation == "per_token_over_step"
        assert len(plan.groups) == 2 and sorted(plan.weight_decay) == [0.0, 0.1], trainer


def test_a_real_difference_between_trainers_is_still_found(
    plans: dict[str, dict[str, TrainingSettings]],
) -> None:
    """The agreement above is not a contract that compares nothing: another momentum, another
    optimizer, another precision each fail it."""
    loop, megatron = plans["sgd"]["loop"].plan, plans["sgd"]["megatron"].plan
    assert loop is not None and megatron is not None
    found = check_contract(loop, replace(megatron, momentum=0.0))
    assert found is not None and found.origin == "momentum"
    adamw = plans["adamw"]["megatron"].plan
    assert adamw is not None
    found = check_contract(loop, adamw)
    assert found is not None and found.origin == "optimizer"
    found = check_contract(loop, replace(megatron, precision="bfloat16"))
    assert found is not None and found.origin == "precision"


def test_loss_normalisation_matters_only_over_several_micro_batches() -> None:
    from dataclasses import replace

    from pytest_precalign.trace.training_record import TrainingPlan
    from pytest_precalign.verdict.training_contract import check_contract

    one = TrainingPlan(
        optimizer="adamw",
        lr=((1e-3,),),
        weight_decay=(0.0,),
        groups=(("w",),),
        betas=(0.9, 0.999),
        eps=1e-8,
        micro_batches=1,
        loss_normalisation="per_token_over_step",
    )
    lightning = replace(one, loss_normalisation="mean_of_micro_batch_means")
    assert check_contract(one, lightning) is None  # one micro-batch: the same loss either way
    diff = check_contract(replace(one, micro_batches=2), replace(lightning, micro_batches=2))
    assert diff is not None and diff.origin == "loss_normalisation"


def test_another_micro_batch_split_under_per_token_normalisation_is_no_difference() -> None:
    """The same rows as 2 micro-batches of 2 or 1 of 4: with the loss per token over the step
    (the Trainer's rule) loss and grads are the same, in the plans and in each step's scalars."""
    from dataclasses import replace

    from pytest_precalign.compare.tolerances import default_table
    from pytest_precalign.trace.step_scalars import StepScalars
    from pytest_precalign.trace.training_record import RunRecord, TrainingPlan
    from pytest_precalign.verdict.training_contract import check_contract
    from pytest_precalign.verdict.training_run import judge_run

    from ..helpers.run_records import planned

    two = TrainingPlan(
        optimizer="sgd",
        lr=((1e-3,),),
        weight_decay=(0.0,),
        groups=(("w",),),
        momentum=0.0,
        micro_batches=2,
        loss_normalisation="per_token_over_step",
    )
    one = replace(two, micro_batches=1)
    assert check_contract(two, one) is None
    scalars = {0: StepScalars(0, loss=1.0, micro_batches=2)}
    split = {0: StepScalars(0, loss=1.0, micro_batches=1)}
    assert (
        judge_run(RunRecord(planned(two), scalars), RunRecord(planned(one), split), {}, default_table()).first
        is None
    )
    means = replace(two, loss_normalisation="mean_of_micro_batch_means")
    diff = check_contract(means, replace(means, micro_batches=1))
    assert diff is not None and diff.origin == "micro_batches"  # there the split changes the loss
