"""Data parallelism with megatron-core's distributed optimizer: a launched Megatron side with
``data_parallel: 2`` trains each replica on its half of every step's micro-batches with
``DistributedDataParallel(use_distributed_optimizer=True)`` + megatron-core's
``DistributedOptimizer`` on CPU under gloo, and gives the single-process run's losses, grad
norms and parameters; the replicas' records merge into one process's trace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pytest_precalign.config.loader import load_config
from pytest_precalign.recording import HookRecorder
from pytest_precalign.run.trainers.megatron import TRAINER as MEGATRON
from pytest_precalign.run.trainers.skeleton import StepSkeleton
from pytest_precalign.sources import build_model, runtime
from pytest_precalign.sources.inputs import build_inputs

pytest.importorskip("megatron.core")

CONFIG = """
version: 1
models:
  mc:
    source: megatron
    config: &c {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64,
                tie_word_embeddings: false}
  mc_dp2: {source: megatron, data_parallel: 2, config: *c}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 128, seed: 3, labels: true}
cases:
  - name: c
    baseline: mc
    candidate: mc_dp2
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    optimizer: {lr: 1.0e-2, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2,
                schedule: {warmup_steps: 1, decay: cosine, min_lr: 1.0e-3}}
    record: {mode: tensor}
"""


@pytest.mark.slow  # torchrun with 2 ranks; tox -e slow
def test_dp2_with_the_distributed_optimizer_trains_as_one_process(tmp_path: Path) -> None:
    from pytest_precalign.run.launch import launch_ranks, merge_launched
    from pytest_precalign.run.trainers.megatron import launched_evidence

    config = load_config(CONFIG, tmp_path / "align.yaml")
    case = config.cases[0]
    assert case.training.trainers.candidate == "megatron"  # a Megatron model's default trainer
    data = build_inputs(config.inputs["toks"], tmp_path, case.steps)
    spec = config.models["mc"]
    with runtime(spec):
        model = build_model(spec, tmp_path)
        full = {n: p.detach().clone() for n, p in model.module.named_parameters()}
        recorder = HookRecorder(model.module, mode="tensor", param_grads="step")
        with recorder:
            local = MEGATRON.train(model, data, case, StepSkeleton(recorder, 0)).manifest_keys()
        one = recorder.trace({})
    out = launch_ranks(config.models["mc_dp2"], tmp_path, case, data, full, 0, tmp_path, trainer="megatron")
    launched = launched_evidence(out, 2, full).manifest_keys()
    arguments = launched["training"]["arguments"]
    assert arguments["optimizer_class"] == ["ChainedOptimizer", "DistributedOptimizer"]
    assert arguments["OptimizerConfig"]["use_distributed_optimizer"] is True
    assert arguments["DistributedDataParallelConfig"]["use_distributed_optimizer"] is True
    assert local["training"]["arguments"]["optimizer_class"] == ["ChainedOptimizer", "FP32Optimizer"]
    for step in range(case.steps):
        a, b = launched["scalars"][str(step)], local["scalars"][str(step)]
        assert a["lr"] == b["lr"] and a["batch_hash"] == b["batch_hash"] and a["tokens"] == b["tokens"]
        for key in ("loss", "grad_norm", "param_norm", "update_norm", "clip_coef"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (step, key)
    merged = merge_launched(out, {}, data_split=True)
    assert merged.manifest["parallel_merge"]["data_split"] == 2
    ours = {r.id: r for r in one.records}
    theirs = {r.id: r for r in merged.records}
    assert set(ours) == set(theirs)  # the replicas' micro-batches are calls 0 and 1, as in one process
    for rid, rec in ours.items():
        if rec.tensor_key is None:
            continue
        a, b = one.tensors[rec.tensor_key], merged.tensors[theirs[rid].tensor_key]
        torch.testing.assert_close(b.float(), a.float(), atol=1e-5, rtol=1e-4, msg=rid)
