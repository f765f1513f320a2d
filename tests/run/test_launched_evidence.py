"""A launched rank's training evidence file is read as what it is (``read_evidence_file``): the
run record's keys and nothing else, so a file of another kind is refused, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.errors import TraceError
from pytest_precalign.run.trainers.megatron import launched_evidence, write_evidence
from pytest_precalign.trace.step_scalars import StepScalars
from pytest_precalign.trace.training_record import TrainingPlan, TrainingSettings, run_record_keys

PLAN = TrainingPlan(optimizer="sgd", lr=((0.1,),), weight_decay=(0.0,), groups=(("w",),))
SETTINGS = TrainingSettings("megatron", "megatron-core", "0.13.0", plan=PLAN)


def test_the_ranks_evidence_is_read_back_as_written(tmp_path: Path) -> None:
    write_evidence(tmp_path, 0, run_record_keys(SETTINGS, {0: StepScalars(0, loss=2.0)}))
    run = launched_evidence(tmp_path, 1, None)
    assert run.settings == SETTINGS and run.scalars[0].loss == 2.0 and run.initial_params is None


def test_a_trace_manifest_in_place_of_the_evidence_is_refused_naming_the_file(tmp_path: Path) -> None:
    manifest = {"record_mode": "stats", "step": 0, **run_record_keys(SETTINGS, {0: StepScalars(0, loss=2.0)})}
    write_evidence(tmp_path, 0, manifest)
    with pytest.raises(TraceError, match=r"training_rank0.json: unknown key\(s\) \['record_mode', 'step'\]"):
        launched_evidence(tmp_path, 1, None)
