"""Settings first, on the user's path (issue #32, items 3 and 6): a real ``transformers.Trainer``
script and a TRL ``SFTTrainer`` + PEFT LoRA script, run in subprocesses and recorded with
``PrecalignCallback``, write their settings and plan; ``precalign compare`` checks the plans
before the numbers and names the difference in the framework's words (``lr_scheduler_type
cosine vs linear``, ``lora_alpha 8 vs 16``, ``bf16 autocast off vs on``); a rerun passes;
computing the plan (stepping the run's own scheduler and putting it back) changes no loss, LR
or grad norm; frozen LoRA base weights are checked unchanged instead of judged every step.

The runs record ``mode="stats"`` every step (what ``precalign compare`` takes before recorded
scalars-mode runs do)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pytest_precalign
from pytest_precalign.cli import main
from pytest_precalign.trace.native_io import read_trace
from pytest_precalign.trace.training_record import read_run_record
from tests.helpers.session_once import made_once

from .hf_user_run import FROZEN_TOUCHED, STEPS

SCRIPT = Path(__file__).with_name("hf_user_run.py")

# Two processes (one per trainer), each running its runs one after the other.
RUNS: dict[str, dict[str, str]] = {
    "hf": {
        "hf": "--scheduler cosine",
        "hf_rerun": "--scheduler cosine",
        "hf_linear": "--scheduler linear",
        "hf_bf16": "--scheduler cosine --bf16 1",
        "hf_bare": "--scheduler cosine --no-callback",
        "hf_scalars": "--scheduler cosine --mode scalars",  # the callback's default mode
    },
    "sft": {
        "sft": "--trainer sft",
        "sft_alpha16": "--trainer sft --alpha 16",
        "sft_touched": "--trainer sft --touch-frozen 2",
        "sft_bare": "--trainer sft --no-callback",
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every run of ``RUNS`` (the two processes at once: the machine has two cores), once per
    session (``made_once``: whichever xdist worker asks first)."""
    root = made_once(tmp_path_factory, "hf_user_runs", _record)
    return {name: root / name for specs in RUNS.values() for name in specs}


def _record(root: Path) -> None:
    src = str(Path(pytest_precalign.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, str(SCRIPT.parents[2])])}
    env["TOKENIZERS_PARALLELISM"] = "false"
    procs = {}
    for group, specs in RUNS.items():
        with (root / f"{group}.log").open("wb") as log:
            command = [sys.executable, str(SCRIPT), str(root), *(f"{n}={o}" for n, o in specs.items())]
            procs[group] = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    for group, proc in procs.items():
        if proc.wait(timeout=900) != 0:
            raise AssertionError(f"{group}: {(root / f'{group}.log').read_text()[-3000:]}")


def _compare(a: Path, b: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["compare", str(a / "rec"), str(b / "rec")])
    return code, capsys.readouterr().out


def _manifest(run: Path, step: int = 0) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run / "rec" / f"step{step}" / "rank0" / "manifest.json").read_text())
    return data


def test_a_trainer_recording_holds_its_settings_and_plan(runs: dict[str, Path]) -> None:
    manifest = _manifest(runs["hf"])
    record = read_run_record(manifest, "step0")
    settings = record.settings
    assert settings is not None and settings.plan is not None
    assert (settings.trainer, settings.framework) == ("hf_trainer", "transformers")
    arguments = settings.arguments
    assert arguments["class"] == "transformers.training_args.TrainingArguments"
    assert arguments["TrainingArguments"]["lr_scheduler_type"] == "cosine"
    assert "output_dir" not in arguments["TrainingArguments"]
    assert arguments["attn_implementation"] == "eager"
    plan = settings.plan
    assert plan.steps == STEPS and plan.optimizer == "adamw"
    assert (plan.clip_grad, plan.micro_batches, plan.loss_normalisation) == (1.0, 2, "per_token_over_step")
    assert (plan.precision, plan.autocast, plan.weight_decay) == ("float32", False, (0.1, 0.0))
    assert "model.embed_tokens.weight" in plan.groups[0] and "model.norm.weight" in plan.groups[1]
    # the plan's LR is the LR each step used (the optimizer's groups at the update)
    used = [read_run_record(_manifest(runs["hf"], s)).scalars[s].lr for s in range(STEPS)]
    assert [tuple(step) for step in plan.lr] == used
    assert settings.adapters == () and settings.frozen == ()
    assert manifest["dtype"] == "float32"
    assert {"trl", "peft", "accelerate", "lightning", "deepspeed"} <= set(manifest["versions"])
    assert manifest["versions"]["peft"] is not None


def test_the_bf16_run_says_what_its_forward_ran_in(runs: dict[str, Path]) -> None:
    manifest = _manifest(runs["hf_bf16"])
    plan = read_run_record(manifest).plan
    assert plan is not None and (plan.precision, plan.autocast) == ("bfloat16", True)
    assert manifest["dtype"] == "bfloat16" and _manifest(runs["hf_bf16"], 3)["dtype"] == "bfloat16"


def test_computing_the_plan_changes_no_loss_lr_or_grad_norm(runs: dict[str, Path]) -> None:
    for recorded, bare in (("hf", "hf_bare"), ("hf_scalars", "hf_bare"), ("sft", "sft_bare")):
        logs = [json.loads((runs[n] / "logs.json").read_text()) for n in (recorded, bare)]
        assert len(logs[0]) == STEPS and logs[0] == logs[1], recorded  # bitwise: JSON of the floats
        plan = read_run_record(_manifest(runs[recorded])).plan  # computed in the run, from its scheduler
        assert plan is not None and len(plan.lr) == STEPS
    manifest = _manifest(runs["hf_scalars"], 1)
    (loss, _, grad_norm) = json.loads((runs["hf_bare"] / "logs.json").read_text())[1]
    assert manifest["record_mode"] == "scalars" and manifest["scalars"]["1"]["loss"] == loss
    assert manifest["scalars"]["1"]["grad_norm"] == grad_norm


def test_a_rerun_passes(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _compare(runs["hf"], runs["hf_rerun"], capsys)
    assert code == 0, out
    assert "settings" not in out


def test_another_scheduler_is_named_as_a_settings_difference(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _compare(runs["hf"], runs["hf_linear"], capsys)
    assert code == 1
    assert "Step 2 diverged first: settings, origin lr " in out
    assert "lr_scheduler_type cosine vs linear: LR differs from step 2 (" in out


def test_bf16_on_one_side_is_named(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _compare(runs["hf"], runs["hf_bf16"], capsys)
    assert code == 1
    assert "Step 0 diverged first: settings, origin precision" in out
    assert "bf16 autocast off vs on: the forward computes in float32 vs bfloat16" in out


def test_an_sft_lora_recording_holds_adapters_frozen_weights_and_log_probs(runs: dict[str, Path]) -> None:
    manifest = _manifest(runs["sft"])
    settings = read_run_record(manifest).settings
    assert settings is not None and settings.plan is not None
    assert settings.arguments["class"] == "trl.trainer.sft_config.SFTConfig"
    (adapter,) = settings.adapters
    assert (adapter.name, adapter.kind, adapter.r, adapter.alpha) == ("default", "LORA", 4, 8.0)
    assert adapter.target_modules == ("q_proj", "v_proj")
    # SFTConfig's bf16=True default autocasts on CPU too: the forward ran in bfloat16
    assert (settings.plan.precision, settings.plan.autocast, manifest["dtype"]) == (
        "bfloat16",
        True,
        "bfloat16",
    )
    # one naming scheme: initial params, plan groups, frozen and records all without base_model.model.
    trace = read_trace(runs["sft"] / "rec" / "step0" / "rank0")
    params = {r.name for r in trace.records if r.kind == "param"}
    assert set(manifest["initial_params"]) == params
    assert settings.frozen is not None and FROZEN_TOUCHED in settings.frozen
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" in settings.frozen
    trained = {n for group in settings.plan.groups for n in group}
    assert trained == params - set(settings.frozen)
    assert trained and all(".lora_" in n for n in trained)
    # TRL's fused LM head builds no logits: its per-token log_probs are recorded, with the loss
    outputs = sorted((r.name, r.call) for r in trace.records if r.kind in ("logits", "loss"))
    assert outputs == [("log_probs", 0), ("log_probs", 1), ("loss", 0), ("loss", 1)]


def test_lora_alpha_is_named(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _compare(runs["sft"], runs["sft_alpha16"], capsys)
    assert code == 1
    assert "Step 0 diverged first: settings, origin lora_alpha" in out
    assert "lora_alpha 8 vs 16 (PEFT adapter 'default')" in out


def test_frozen_weights_are_checked_unchanged_not_judged_each_step(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _compare(runs["sft"], runs["sft_touched"], capsys)
    assert code == 1
    assert f"frozen parameter {FROZEN_TOUCHED} changed on the candidate: after step 2" in out
    # the step phase judges the 8 adapter weights of each of the 5 steps, not the frozen 27
    report = tmp_path / "report"
    assert main(["compare", str(runs["sft"] / "rec"), str(runs["sft"] / "rec"), "--report", str(report)]) == 0
    assert "[step]: 40 compared" in capsys.readouterr().out
