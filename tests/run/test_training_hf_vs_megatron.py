"""HF Qwen2 trained by the tool's loop vs megatron-core's GPTModel trained by its own stack
(10 steps: warmup 2, cosine, clipping, weight decay, 2 micro-batches): the clean pair is
aligned over the 10 steps (plans, scalars and records); with the Megatron side's AdamW planted with eps 1e-6 (example_suites/qwen2_5_megatron_vs_hf/faults.py): the run
verdict names optimizer_update at step 1, the first update with a nonzero LR, and its
expectation in the config passes only at that step and class."""

from __future__ import annotations

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case
from pytest_precalign.vocabulary import OPTIMIZER_UPDATE
from tests.helpers.paths import REPO

pytest.importorskip("megatron.core")

CONFIG = """
version: 1
defaults: {device: cpu, dtype: float32, seed: 0, deterministic: true}
models:
  hf:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: &q {vocab_size: 256, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1.0e-6,
                rope_theta: 1000000.0, max_position_embeddings: 64, tie_word_embeddings: false}
  megatron: {source: megatron, preset: qwen2.5, config: *q}
  megatron_eps: {source: megatron, preset: qwen2.5, config: *q, patch: "faults:adamw_eps1e6"}
inputs:
  tokens: {kind: tokens, batch: 4, seq_len: 16, vocab_size: 256, seed: 1, labels: true}
tolerances:
  fp32:
    - {match: "*", kind: loss, atol: 1.0e-5, rtol: 0}
    - {match: "*", atol: 1.0e-4, rtol: 1.0e-3}
cases:
  - name: clean
    baseline: hf
    candidate: megatron
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward, step]
    steps: 10
    training: {baseline: loop, candidate: megatron}
    optimizer: &spec {name: adamw, lr: 1.0e-3, weight_decay: 0.1, clip_grad: 1.0, micro_batches: 2,
                      schedule: {warmup_steps: 2, decay: cosine, min_lr: 1.0e-4}}
    record: {mode: tensor}
    tolerances: fp32
  - name: eps_bug
    baseline: hf
    candidate: megatron_eps
    inputs: tokens
    mapping: "preset:megatron-qwen2.5"
    phases: [forward, backward, step]
    steps: 10
    training: {baseline: loop, candidate: megatron}
    optimizer: *spec
    record: {mode: tensor}
    tolerances: fp32
    expect: {step: 1, diverged: optimizer_update}
"""


def test_a_planted_adamw_eps_on_the_megatron_side_is_the_optimizer_update_at_step_1() -> None:
    folder = REPO / "example_suites" / "qwen2_5_megatron_vs_hf"  # its faults.py
    config = load_config(CONFIG, folder / "align_training_eps.yaml")
    run = run_case(config, config.case("eps_bug"))
    assert run.training is not None and run.training.first is not None
    first = run.training.first
    assert (first.step, first.what) == (1, "optimizer_update"), first
    assert run.training.passed and run.training.met  # the case's expect: is met
    assert run.training.findings == () and run.training.steps_compared == 10


def test_the_clean_10_step_hf_vs_megatron_run_is_aligned() -> None:
    folder = REPO / "example_suites" / "qwen2_5_megatron_vs_hf"
    config = load_config(CONFIG, folder / "align_training_eps.yaml")
    run = run_case(config, config.case("clean"))
    assert run.training is not None and run.training.passed, (run.training.first, run.training.findings)
    assert run.training.steps_compared == 10 and run.training.lane == "approximate"
    assert all(v.passed for v in run.verdicts.values())
    # Every parameter after every update judged on its inputs (#28 item 3): each side's step
    # recomputed with its LR and clip factor of that step, and within rounding of it.
    params = [p for p in run.comparison.pairs if p.record.kind == "param" and p.paired]
    assert {p.record.step for p in params} == set(range(10))
    assert all(any(c.metric == OPTIMIZER_UPDATE and c.passed for c in p.checks) for p in params)
