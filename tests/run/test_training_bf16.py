"""bf16 training, each framework's own way: transformers.Trainer with TrainingArguments(bf16=True)
over float32 master weights vs megatron-core's stack on a bf16 model with Float16OptimizerWith-
Float16Params' fp32 main params. The suite's bf16 cases shortened (the 10-step cases run in
tox -e slow, tests/integration/test_training_suite_megatron.py): the translated settings in each
manifest, the float32 copies each optimizer steps recorded, the user's bf16 model left bf16, the
pair aligned under the suite's bf16 table, and a 1.01 scaling of one MLP failing under it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config_file
from pytest_precalign.config.specs import Models
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.case import run_case
from pytest_precalign.run.trainers.hf_trainer import TRAINER as HF_TRAINER
from pytest_precalign.run.trainers.skeleton import StepSkeleton
from pytest_precalign.sources import build_model, runtime
from pytest_precalign.sources.inputs import build_inputs
from tests.helpers.paths import EXAMPLES

pytest.importorskip("megatron.core")
pytest.importorskip("accelerate")

SUITE = EXAMPLES / "training" / "align.yaml"


def _case(name: str, steps: int, baseline: str | None = None) -> tuple[object, object]:
    config = load_config_file(SUITE)
    case = dataclasses.replace(config.case(name), steps=steps)
    if baseline is not None:
        case = dataclasses.replace(case, sides=Models(baseline, case.models.candidate))
    return config, case


def test_both_sides_write_their_bf16_translation_and_record_the_fp32_copies_they_step() -> None:
    config, case = _case("hf_trainer_vs_megatron_bf16", steps=3)
    run = run_case(config, case)  # type: ignore[arg-type]
    hf = run.baseline.manifest["training"]["arguments"]
    assert hf["TrainingArguments"]["bf16"] is True
    assert hf["master_params_dtype"] == "float32" and "master" in hf["recorded_params"]
    mc = run.candidate.manifest["training"]["arguments"]
    optimizer = mc["OptimizerConfig"]
    assert optimizer["bf16"] is True and optimizer["params_dtype"] == "bfloat16"
    assert optimizer["main_params_dtype"] == "float32"
    assert mc["DistributedDataParallelConfig"]["grad_reduce_in_fp32"] is True
    assert mc["recorded_params"].startswith("main_param")
    assert mc["wrappers"] == ["DistributedDataParallel", "Float16Module"]  # Megatron-LM's get_model
    logits = [r for r in run.candidate.records if r.kind == "logits"]
    assert logits and {r.dtype for r in logits} == {"float32"}  # through Float16Module: fp32 out
    for trace in (run.baseline, run.candidate):  # the copies the optimizers step: float32
        params = [r for r in trace.records if r.kind == "param"]
        assert params and {r.dtype for r in params} == {"float32"}
        acts = [r for r in trace.records if r.kind == "activation" and r.name.endswith("mlp.down_proj")]
        assert acts and {r.dtype for r in acts} == {"bfloat16"}  # the forward computes in bf16
    assert all(v.passed for v in run.verdicts.values()), {p: v.first for p, v in run.verdicts.items()}
    assert run.training is not None and run.training.passed, run.training  # the steps' scalars too


def test_a_one_percent_mlp_scaling_fails_under_the_bf16_table() -> None:
    config, case = _case("hf_trainer_vs_megatron_bf16", steps=3, baseline="hf_bf16_mlp_scaled")
    run = run_case(config, case)  # type: ignore[arg-type]
    forward = run.verdicts["forward"]
    assert not forward.passed
    first = forward.failures[0]  # execution order: the scaled module, at the first step
    assert (first.record.name, first.record.step) == ("model.layers.1.mlp", 0)
    assert [c.metric for c in first.checks if not c.passed] == ["five_thousandth"]
    # named there, not at the embedding (float32 under autocast, bf16 on Megatron) before it
    assert forward.first is not None and (forward.first.name, forward.first.step) == ("model.layers.1.mlp", 0)
    assert not run.verdicts["backward"].passed


def test_the_trainer_leaves_the_users_bf16_model_bf16_with_its_own_forward(tmp_path: Path) -> None:
    config, case = _case("hf_trainer_vs_megatron_bf16", steps=1)
    spec = config.models["hf_bf16"]  # type: ignore[attr-defined]
    data = build_inputs(config.inputs["tokens"], tmp_path, 1)  # type: ignore[attr-defined]
    with runtime(spec):
        model = build_model(spec, tmp_path)
        module = model.module
        before = {n: p.detach().clone() for n, p in module.named_parameters()}
        recorder = HookRecorder(module, mode="stats")
        with recorder:
            extra = HF_TRAINER.train(model, data, case, StepSkeleton(recorder, 0))  # type: ignore[arg-type]
    assert extra.settings is not None
    assert extra.settings.arguments["TrainingArguments"]["bf16"] is True
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert "forward" not in vars(module) and "_original_forward" not in vars(module)
    changed = [n for n, p in module.named_parameters() if not torch.equal(p, before[n])]
    assert changed == []  # update 0 has LR 0: the master weights round back to the same bf16
