"""``precalign validate`` refuses what ``run`` cannot train (issue #34 item 5): non-finite LR,
weight decay, eps; betas outside [0, 1); a warmup longer than the run; a megatron-core side's
scheduler constraints; an ``expect`` step beyond the steps -- each one message naming the YAML
line and the key (they were accepted, then trained NaN on both sides and passed, or failed in
torch with no key).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_precalign.cli import main

CONFIG = """\
version: 1
models:
  base: {source: factory, factory: "tiny_models:build"}
  cand: {source: factory, factory: "tiny_models:build"}
  mcore: {source: megatron, preset: qwen2.5, config: {vocab_size: 16, hidden_size: 8, num_hidden_layers: 1,
          num_attention_heads: 2, num_key_value_heads: 2, intermediate_size: 16}}
inputs:
  toks: {kind: tokens, batch: 2, seq_len: 3, vocab_size: 4, labels: true}
cases:
  - name: c1
    baseline: BASE
    candidate: CAND
    inputs: toks
    phases: [forward, backward, step]
    steps: 4
    optimizer:
      name: adamw
      OPTIMIZER
"""

TINY = """import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 16))
"""


def _validate(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    optimizer: str,
    sides: str = "base cand",
    tail: str = "",
) -> str:
    (tmp_path / "tiny_models.py").write_text(TINY)
    base, cand = sides.split()
    text = CONFIG.replace("BASE", base).replace("CAND", cand).replace("OPTIMIZER", optimizer) + tail
    config = tmp_path / "align.yaml"
    config.write_text(text)
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0].removeprefix(f"precalign: error: {config}:")


@pytest.mark.parametrize(
    ("optimizer", "expected"),
    [
        ("lr: .inf", "18: cases[0].optimizer.lr: must be a finite number >= 0, got inf"),
        ("weight_decay: .inf", "18: cases[0].optimizer.weight_decay: must be a finite number >= 0, got inf"),
        ("eps: .inf", "18: cases[0].optimizer.eps: must be a finite number >= 0, got inf"),
        (
            "betas: [0.9, 1.5]",
            "18: cases[0].optimizer.betas: each beta must be in [0, 1) (Adam's running averages), got [0.9, 1.5]",
        ),
        (
            "betas: [.nan, 0.999]",
            "18: cases[0].optimizer.betas: each beta must be in [0, 1) (Adam's running averages), got [nan, 0.999]",
        ),
        ("betas: [-0.1, 0.999]", "18: cases[0].optimizer.betas: each beta must be in [0, 1)"),
        ("clip_grad: .inf", "18: cases[0].optimizer.clip_grad: must be > 0 and finite"),
        (
            "schedule: {warmup_steps: 20}",
            "18: cases[0].optimizer.schedule.warmup_steps: warmup_steps 20 is longer than the run (steps 4): "
            "the LR would never reach lr",
        ),
        ("schedule: {min_lr: .inf}", "18: cases[0].optimizer.schedule.min_lr: must be a finite number >= 0"),
    ],
)
def test_a_setting_run_cannot_train_is_refused_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], optimizer: str, expected: str
) -> None:
    assert _validate(tmp_path, capsys, optimizer).startswith(expected)


def test_a_megatron_side_schedule_is_checked_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``warmup_steps: 5`` over 3 steps of a decaying schedule: megatron-core's scheduler
    decays after the warmup; ``run`` named a decay_steps the config never set."""
    message = _validate(tmp_path, capsys, "schedule: {warmup_steps: 4, decay: cosine}", "mcore mcore")
    assert message == (
        "18: cases[0].optimizer.schedule.warmup_steps: the baseline side trains with megatron-core: "
        "megatron-core's OptimizerParamScheduler decays after the warmup: the case's steps (no decay_steps "
        "given) (4) must be > warmup_steps (4)"
    )
    message = _validate(tmp_path, capsys, "schedule: {warmup_steps: 5, decay: cosine}", "mcore mcore")
    assert message.startswith(
        "18: cases[0].optimizer.schedule.warmup_steps: warmup_steps 5 is longer than the run"
    )


def test_an_expected_step_beyond_the_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    message = _validate(tmp_path, capsys, "lr: 0.01", tail="    expect: {step: 50, diverged: weights}\n")
    assert message == "19: cases[0].expect.step: step 50 is beyond the case's steps (4: steps 0..3)"


def test_an_expected_contract_class_names_the_settings_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``contract`` is the check before step 0; the class it names is ``settings`` (#33 item 6)."""
    message = _validate(tmp_path, capsys, "lr: 0.01", tail="    expect: {step: 1, diverged: contract}\n")
    assert message == (
        "19: cases[0].expect.diverged: 'contract' names the check before step 0, not a class: a "
        "settings difference it finds is diverged: settings"
    )
