"""The tool's own loop (``training: loop``) trains like a real run: a new batch per step,
warmup + decay via torch's LambdaLR, clipping, weight-decay groups, micro-batches normalised
per token over the step, and every step's scalars + the translated plan in the trace."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_precalign.config.loader import load_config
from pytest_precalign.run.case import run_case
from pytest_precalign.run.trainers.loop_optimizer import lr_factor
from pytest_precalign.steps.spec import ScheduleSpec
from pytest_precalign.trace.step_scalars import scalars_of

CONFIG = """\
version: 1
defaults: {{device: cpu, dtype: float32, seed: 0}}
models:
  a:
    source: hf
    class: transformers.Qwen2ForCausalLM
    attn_implementation: eager
    config: {{vocab_size: 128, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
              num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64}}
inputs:
  toks: {{kind: tokens, batch: 4, seq_len: 8, vocab_size: 128, seed: 1, labels: true}}
cases:
  - name: c
    baseline: a
    candidate: a
    inputs: toks
    phases: [forward, backward, step]
    steps: 4
    optimizer: {{lr: 0.01, weight_decay: 0.1, micro_batches: {micro}, clip_grad: {clip},
                schedule: {{warmup_steps: 2, decay: cosine, min_lr: 0.001}}}}
"""


def _run(tmp_path: Path, micro: int = 2, clip: float = 0.05):  # type: ignore[no-untyped-def]
    config = load_config(CONFIG.format(micro=micro, clip=clip), tmp_path / "align.yaml")
    return run_case(config, config.cases[0])


def test_every_step_has_its_scalars_and_the_plan_is_the_schedulers(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert run.verdicts["step"].passed
    manifest = run.baseline.manifest
    scalars = scalars_of(manifest)
    assert sorted(scalars) == [0, 1, 2, 3]
    plan = manifest["training"]["plan"]
    lrs = [s.lr for s in scalars.values()]
    assert [tuple(p) for p in plan["lr"]] == lrs  # the LR each update used = the plan
    assert lrs[0] == (0.0, 0.0) and lrs[1] == (0.005, 0.005) and lrs[2] == (0.01, 0.01)
    assert math.isclose(lrs[3][0], 0.001 + 0.5 * (0.01 - 0.001), rel_tol=1e-12)
    assert plan["weight_decay"] == [0.1, 0.0]
    assert all(name.endswith(("bias", "norm.weight")) for name in plan["groups"][1])
    assert "model.embed_tokens.weight" in plan["groups"][0]
    assert len({s.batch_hash for s in scalars.values()}) == 4  # a new batch each step
    for s in scalars.values():
        assert s.micro_batches == 2 and s.tokens == 32 and s.skipped is False
        assert s.grad_norm is not None and s.grad_norm > 0.05 and s.clip_coef is not None
        assert math.isclose(s.clip_coef * s.grad_norm, 0.05, rel_tol=1e-4)  # clipped to 0.05
        assert s.weight_decay == (0.1, 0.0) and s.loss is not None and s.loss > 0
    assert scalars[0].update_norm == 0.0 and (scalars[1].update_norm or 0) > 0  # LR 0 at update 0
    assert set(manifest["initial_params"]) >= {"model.embed_tokens.weight", "lm_head.weight"}
    assert run.candidate.manifest["scalars"] == manifest["scalars"]


def test_micro_batches_are_per_token_over_the_step(tmp_path: Path) -> None:
    whole = scalars_of(_run(tmp_path / "one", micro=1).baseline.manifest)
    split = scalars_of(_run(tmp_path / "two", micro=2).baseline.manifest)
    for step in whole:
        assert whole[step].batch_hash == split[step].batch_hash
        assert math.isclose(whole[step].loss or 0, split[step].loss or 1, rel_tol=1e-5)
        assert math.isclose(whole[step].grad_norm or 0, split[step].grad_norm or 1, rel_tol=1e-4)


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (ScheduleSpec(warmup_steps=2), [0.0, 0.5, 1.0, 1.0]),
        (ScheduleSpec(warmup_steps=1, decay="linear"), [0.0, 1.0, 2 / 3, 1 / 3]),
        (ScheduleSpec(warmup_steps=0, decay="linear", decay_steps=2, min_lr=0.1), [1.0, 0.55, 0.1, 0.1]),
        (ScheduleSpec(warmup_steps=0, decay="cosine"), [1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, None]),
    ],
)
def test_lr_factor_follows_the_spec(schedule: ScheduleSpec, expected: list[float | None]) -> None:
    got = [lr_factor(schedule, 1.0, 4, s) for s in range(4)]
    for g, e in zip(got, expected, strict=True):
        if e is not None:
            assert math.isclose(g, e, rel_tol=1e-12, abs_tol=1e-15)
