"""The typed record of a training run: what writers build is what the reader gives back, and a
malformed block is one TraceError naming the key."""

from __future__ import annotations

import json

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import (
    Adapter,
    TrainingPlan,
    TrainingSettings,
    read_evidence_file,
    read_run_record,
    run_record_keys,
)

PLAN = TrainingPlan(
    optimizer="adamw",
    lr=((0.0, 0.0), (1e-3, 1e-3)),
    weight_decay=(0.1, 0.0),
    groups=(("w",), ("b",)),
    betas=(0.9, 0.999),
    eps=1e-8,
    clip_grad=1.0,
    micro_batches=2,
    loss_normalisation="per_token_over_step",
    precision="float32",
    autocast=False,
    gradient_checkpointing=False,
)
SETTINGS = TrainingSettings(
    "callback",
    "transformers",
    "5.0",
    {"TrainingArguments": {"lr_scheduler_type": "cosine"}},
    PLAN,
    (Adapter("default", "LORA", 8, 16.0, 0.0, ("q_proj", "v_proj")),),
    ("w",),
)


def test_round_trip_through_json() -> None:
    keys = run_record_keys(
        SETTINGS, {0: StepScalars(0, loss=1.5)}, {"w": {"max": 1, "min": 0, "mean": 0.5, "norm": 2}}
    )
    record = read_run_record(json.loads(json.dumps(keys)), "m.json")
    assert record.settings == SETTINGS
    assert record.plan is not None and record.plan.steps == 2
    assert record.scalars[0].loss == 1.5
    assert record.initial_params == {"w": {"max": 1.0, "min": 0.0, "mean": 0.5, "norm": 2.0}}


def test_nothing_recorded_is_an_empty_record() -> None:
    record = read_run_record({}, "m.json")
    assert record.settings is None and not record.scalars and record.initial_params is None
    assert not record.is_training


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"lr": [["a"]]}, "plan.lr[0][0]"),
        ({"lr": 5}, "plan.lr"),
        ({"groups": 7}, "plan.groups"),
        ({"weight_decay": {"a": 1}}, "plan.weight_decay"),
        ({"betas": [0.9]}, "plan.betas"),
        ({"eps": float("inf")}, "plan.eps"),
        ({"micro_batches": 0}, "plan.micro_batches"),
        ({"precision": "fp8"}, "plan.precision"),
        ({"autocast": "yes"}, "plan.autocast"),
        ({"surprise": 1}, "unknown key"),
        ({"lr": [[1e-3]]}, "plan.lr[0]: 1 groups"),
    ],
)
def test_a_malformed_plan_names_the_key(change: dict[str, object], key: str) -> None:
    block = SETTINGS.as_dict()
    block["plan"] = {**block["plan"], **change}
    with pytest.raises(TraceError, match="m.json: training") as info:
        read_run_record({"training": block}, "m.json")
    assert key in str(info.value)


def test_initial_params_must_be_summaries() -> None:
    with pytest.raises(TraceError, match="initial_params: expected a mapping"):
        read_run_record({"initial_params": [1, 2, 3]}, "m.json")
    with pytest.raises(TraceError, match=r"missing \['min', 'mean', 'norm'\]"):
        read_run_record({"initial_params": {"w": {"max": 1}}}, "m.json")


@pytest.mark.parametrize(
    ("scalars", "key"),
    [
        ({"step": 0, "loss": [1.0, 2.0]}, "loss: expected a number or null, got list"),
        ({"step": 0, "grad_norm": "abc"}, "grad_norm: expected a number or null, got str"),
        ({"step": 0, "batch_hash": 12345}, "batch_hash: expected a string or null, got int"),
        ({"step": "0"}, "step: expected an integer >= 0, got str"),
        ({"step": 0, "lr": ["a"]}, "lr: expected a list of numbers"),
        ({"step": 0, "skipped": 1}, "skipped: expected true, false or null"),
        ({"loss": 1.0}, "no 'step'"),
    ],
)
def test_malformed_step_scalars_name_the_key(scalars: dict[str, object], key: str) -> None:
    with pytest.raises(TraceError, match="m.json: scalars") as info:
        read_run_record({"scalars": {"0": scalars}}, "m.json")
    assert key in str(info.value)


def test_step_scalars_keep_nan_for_the_verdict_to_judge() -> None:
    record = read_run_record({"scalars": {"2": {"step": 2, "loss": float("nan")}}}, "m.json")
    assert record.scalars[2].loss != record.scalars[2].loss


def test_a_trace_is_given_its_run_record_and_one_built_without_it_is_refused() -> None:
    """``Trace.run`` never parses: the builder gives it (a loader reads it); a trace whose
    manifest carries run keys but which holds no run would say "not a training run" in silence."""
    from pytest_precalign.trace.records import Trace

    keys = json.loads(json.dumps(run_record_keys(SETTINGS, {0: StepScalars(0, loss=1.5)})))
    with pytest.raises(
        TraceError, match=r"carries \['training', 'scalars'\] was built without its run record"
    ):
        Trace(keys, ())
    trace = Trace(keys, (), run=read_run_record(keys))
    assert trace.run.settings == SETTINGS and trace.scalars[0].loss == 1.5
    kept = trace.with_records(()).with_notes(grads_missing=())
    assert kept.run is trace.run  # a trace made from another keeps its typed record
    assert Trace({"record_mode": "stats"}, ()).run.is_empty  # no run keys: no run


def test_a_training_evidence_file_holds_the_run_record_and_nothing_else() -> None:
    keys = json.loads(json.dumps(run_record_keys(SETTINGS, {0: StepScalars(0, loss=1.5)})))
    assert read_evidence_file(keys, "training_rank0.json").settings == SETTINGS
    with pytest.raises(TraceError, match=r"training_rank0.json: unknown key\(s\) \['record_mode'\]"):
        read_evidence_file({**keys, "record_mode": "stats"}, "training_rank0.json")
    with pytest.raises(TraceError, match="training_rank0.json: expected a mapping, got list"):
        read_evidence_file([keys], "training_rank0.json")
