"""``training: hf_trainer``: a real ``transformers.Trainer`` trains a side from the case's
optimizer spec (warmup, cosine to min_lr, clipping, weight decay without norms and biases,
2 micro-batches, a new batch each step) and aligns with the tool's own loop; the translation
(TrainingArguments) and the plan (its own scheduler's LRs, its own groups) are in the manifest."""

from __future__ import annotations

import math
from pathlib import Path

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case
from pytest_precalign.trace.step_scalars import scalars_of
from pytest_precalign.trace.training_record import read_run_record

CONFIG = """\
version: 1
defaults: {device: cpu, dtype: float32, seed: 0}
models:
  a:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: {vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
              num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}
inputs:
  toks: {kind: tokens, batch: 4, seq_len: 8, vocab_size: 128, seed: 1, labels: true}
tolerances:
  fp32:
    - {match: "*", atol: 1.0e-5, rtol: 1.0e-4}
cases:
  - name: loop_vs_trainer
    baseline: a
    candidate: a
    inputs: toks
    phases: [forward, backward, step]
    steps: 4
    tolerances: fp32
    training: {baseline: loop, candidate: hf_trainer}
    optimizer: {lr: 0.01, weight_decay: 0.1, micro_batches: 2, clip_grad: 0.05,
                schedule: {warmup_steps: 2, decay: cosine, min_lr: 0.001}}
"""


def test_trainer_side_aligns_with_the_loop_and_writes_its_translation(tmp_path: Path) -> None:
    config = load_config(CONFIG, tmp_path / "align.yaml")
    run = run_case(config, config.cases[0])
    assert all(v.passed for v in run.verdicts.values()), run.verdicts
    loop, trainer = run.baseline.manifest["training"], run.candidate.manifest["training"]
    assert loop["trainer"] == "loop" and trainer["trainer"] == "hf_trainer"
    assert trainer["framework"]["name"] == "transformers"
    args = trainer["arguments"]["TrainingArguments"]
    assert args["lr_scheduler_type"] == "cosine_with_min_lr" and args["lr_scheduler_kwargs"] == {
        "min_lr": 0.001
    }
    assert args["warmup_steps"] == 2 and args["max_grad_norm"] == 0.05 and args["max_steps"] == 4
    assert args["gradient_accumulation_steps"] == 2 and args["per_device_train_batch_size"] == 2
    assert trainer["plan"]["lr"] == loop["plan"]["lr"]  # the Trainer's scheduler = the loop's
    assert trainer["plan"]["groups"] == loop["plan"]["groups"]  # its decay rule = biases and norms
    assert trainer["plan"]["weight_decay"] == [0.1, 0.0]
    base, cand = scalars_of(run.baseline.manifest), scalars_of(run.candidate.manifest)
    assert sorted(cand) == [0, 1, 2, 3]
    for step in base:
        b, c = base[step], cand[step]
        assert b.batch_hash == c.batch_hash and b.tokens == c.tokens and c.micro_batches == 2
        assert b.lr == c.lr and b.weight_decay == c.weight_decay
        assert math.isclose(b.loss or 0, c.loss or 1, rel_tol=1e-5)
        assert math.isclose(b.grad_norm or 0, c.grad_norm or 1, rel_tol=1e-5)
        assert math.isclose(b.clip_coef or 0, c.clip_coef or 1, rel_tol=1e-5)
    assert cand[0].lr == (0.0, 0.0) and cand[0].update_norm == 0.0  # warmup from 0: no update at 0
    assert set(run.candidate.manifest["initial_params"]) == set(run.baseline.manifest["initial_params"])


def test_sgd_with_momentum_and_plain_adam_train_as_the_loop_does(tmp_path: Path) -> None:
    """SGD with momentum (``optim="sgd"``, ``optim_args="momentum=..."``) and plain Adam (the
    Trainer's ``optimizer_cls_and_kwargs``): the Trainer's optimizer is the loop's, the plans
    agree and the run aligns step after step."""
    cases = (
        CONFIG.split("cases:\n")[0]
        + "cases:\n"
        + "".join(
            f"""  - name: {name}
    baseline: a
    candidate: a
    inputs: toks
    phases: [forward, backward, step]
    steps: 3
    tolerances: fp32
    training: {{baseline: loop, candidate: hf_trainer}}
    optimizer: {optimizer}
"""
            for name, optimizer in (
                ("sgd_momentum", "{name: sgd, lr: 0.05, momentum: 0.9, weight_decay: 0.1, micro_batches: 2}"),
                ("adam", "{name: adam, lr: 0.01, weight_decay: 0.1, betas: [0.9, 0.95]}"),
            )
        )
    )
    config = load_config(cases, tmp_path / "align.yaml")
    for case, name in zip(config.cases, ("sgd", "adam"), strict=True):
        run = run_case(config, case)
        assert run.training is not None and run.training.passed, run.training
        assert all(v.passed for v in run.verdicts.values()), case.name
        plan = read_run_record(run.candidate.manifest).plan  # the optimizer the Trainer built
        assert plan is not None and plan.optimizer == name
        assert (plan.momentum, plan.betas) == ((0.9, None) if name == "sgd" else (None, (0.9, 0.95)))
        base, cand = scalars_of(run.baseline.manifest), scalars_of(run.candidate.manifest)
        assert cand[2].update_norm and math.isclose(
            base[2].update_norm or 0, cand[2].update_norm, rel_tol=1e-4
        )
