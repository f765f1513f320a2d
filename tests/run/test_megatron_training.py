"""A case side trained by megatron-core's own stack in this process (training: megatron): the
case's batches and micro-batches through the real DDP, optimizer and scheduler, the layers
recorded with main_grad at param_grads='step', and the manifest's training evidence."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.errors import CaseError
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.trainers.megatron import TRAINER as MEGATRON
from pytest_precalign.run.trainers.skeleton import StepSkeleton
from pytest_precalign.sources import build_model, runtime
from pytest_precalign.sources.inputs import build_inputs
from pytest_precalign.trace.step_scalars import scalars_of

pytest.importorskip("megatron.core")

CONFIG = """
version: 1
models:
  mc:
    source: megatron
    config: &c {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64,
                tie_word_embeddings: false}
  mc_tp: {source: megatron, tensor_parallel: 2, pipeline_parallel: 2, config: *c}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 128, seed: 3, labels: true}
cases:
  - name: c
    baseline: mc
    candidate: mc
    inputs: toks
    phases: [forward, backward, step]
    steps: 4
    optimizer: {lr: 1.0e-2, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2,
                schedule: {warmup_steps: 2, decay: cosine, min_lr: 1.0e-3}}
    record: {mode: tensor}
"""


def _run(tmp_path: Path, param_grads: str = "step") -> tuple[dict, object]:
    config = load_config(CONFIG, tmp_path / "align.yaml")
    case = config.cases[0]
    spec = config.models["mc"]
    data = build_inputs(config.inputs["toks"], tmp_path, case.steps)
    with runtime(spec):
        model = build_model(spec, tmp_path)
        recorder = HookRecorder(model.module, mode="stats", param_grads=param_grads)
        with recorder:
            extra = MEGATRON.train(model, data, case, StepSkeleton(recorder, 0))
        return extra.manifest_keys(), recorder.trace({})


def test_a_case_side_trains_with_megatrons_stack(tmp_path: Path) -> None:
    extra, trace = _run(tmp_path)
    training = extra["training"]
    assert training["trainer"] == "megatron"
    assert training["arguments"]["OptimizerConfig"]["clip_grad"] == 1.0
    assert training["plan"]["micro_batches"] == 2 and len(training["plan"]["lr"]) == 4
    scalars = scalars_of({"scalars": extra["scalars"]})
    assert sorted(scalars) == [0, 1, 2, 3]
    assert [list(s.lr) for s in scalars.values()] == training["plan"]["lr"]
    assert all(s.tokens == 4 * 16 and s.micro_batches == 2 for s in scalars.values())
    assert len({s.batch_hash for s in scalars.values()}) == 4  # a new batch each step
    assert "decoder.final_layernorm.weight" in extra["initial_params"]
    kinds = {(r.kind, r.step) for r in trace.records}
    assert {("param_grad", 3), ("param", 3), ("loss", 0)} <= kinds
    grads = [r for r in trace.records if r.kind == "param_grad" and r.name == "output_layer.weight"]
    assert len(grads) == 4  # one per step: main_grad after finalize_model_grads
    assert {r.call for r in grads} == {1}  # accumulated over 2 micro-batches: the last one's call
    assert {r.call for r in trace.records if r.kind == "loss" and r.step == 0} == {0, 1}


def test_the_megatron_trainer_refuses_per_call_grads(tmp_path: Path) -> None:
    with pytest.raises(CaseError, match="param_grads='step'"):
        _run(tmp_path, param_grads="backward")
    assert torch.distributed.is_initialized() is False


@pytest.mark.slow  # torchrun with 4 ranks; tox -e slow
def test_launched_tp2_pp2_trains_as_in_process(tmp_path: Path) -> None:
    """TP=2 x PP=2 ranks under torchrun with megatron-core's own stack (DDP, optimizer,
    scheduler, finalize_model_grads, the 1F1B schedule) give the in-process stack's losses, grad
    norms, LRs and update norms step by step; the plan's groups are united over the stages."""
    from pytest_precalign.run.launch import launch_ranks
    from pytest_precalign.run.trainers.megatron import launched_evidence

    config = load_config(CONFIG, tmp_path / "align.yaml")
    case = config.cases[0]
    data = build_inputs(config.inputs["toks"], tmp_path, case.steps)
    spec = config.models["mc"]
    with runtime(spec):
        model = build_model(spec, tmp_path)
        full = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        recorder = HookRecorder(model.module, mode="stats", param_grads="step")
        with recorder:
            local = MEGATRON.train(model, data, case, StepSkeleton(recorder, 0)).manifest_keys()
    out = launch_ranks(config.models["mc_tp"], tmp_path, case, data, full, 0, tmp_path, trainer="megatron")
    launched = launched_evidence(out, 4, full).manifest_keys()
    assert launched["training"]["plan"]["lr"] == local["training"]["plan"]["lr"]
    for ours, theirs in zip(
        launched["training"]["plan"]["groups"], local["training"]["plan"]["groups"], strict=True
    ):
        assert sorted(ours) == sorted(theirs)
    assert launched["initial_params"] == local["initial_params"]
    for step in range(case.steps):
        a, b = launched["scalars"][str(step)], local["scalars"][str(step)]
        assert a["lr"] == b["lr"] and a["batch_hash"] == b["batch_hash"]
        for key in ("loss", "grad_norm", "param_norm", "update_norm", "clip_coef"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (step, key)
    from pytest_precalign.trace.native_io import read_trace

    last_stage = read_trace(out / "step3" / "rank3")  # grads accumulated over 2 micro-batches: call 1
    assert {r.call for r in last_stage.records if r.kind == "param_grad"} == {1}
