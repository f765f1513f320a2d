"""example_suites/training's Megatron case end to end: transformers.Trainer vs megatron-core's
own stack (DDP, get_megatron_optimizer, OptimizerParamScheduler) over 10 steps, aligned under the
suite's table, each side's translated settings in its manifest."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import ExampleSuite, RunPytest

pytest.importorskip("megatron.core")
pytest.importorskip("accelerate")


@pytest.mark.slow  # 10 training steps of two models with tensors recorded (~90 s on 2 cores)
def test_hf_trainer_vs_megatron_stack_aligns_over_ten_steps(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("training")
    result = run_pytest(
        "--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out",
        "-k", "hf_trainer_vs_megatron and not launched and not bf16",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 3, result.stdout.str()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    phases = {c["phase"] for c in report["cases"] if c["name"] == "hf_trainer_vs_megatron"}
    assert phases == {"forward", "backward", "step"}


@pytest.mark.slow  # 4 ranks under torchrun, 10 steps
def test_hf_trainer_vs_megatron_stack_at_tp2_pp2_under_torchrun(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("training")
    result = run_pytest(
        "--align-config", str(folder / "align.yaml"), str(folder), "-k", "tp2_pp2_launched and not bf16",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 3, result.stdout.str()


@pytest.mark.slow  # 10 bf16 training steps of two models with tensors recorded, then 4 ranks
@pytest.mark.parametrize(
    "case", ["hf_trainer_vs_megatron_bf16", "hf_trainer_vs_megatron_bf16_tp2_pp2_launched"]
)
def test_bf16_trainer_vs_megatron_aligns_over_ten_steps_under_the_bf16_table(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest, case: str
) -> None:
    folder = example_suite("training")
    result = run_pytest(
        "--align-config", str(folder / "align.yaml"), str(folder), "--align-report", "out",
        "-k", case if "launched" in case else f"{case} and not launched",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 3, result.stdout.str()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    step = next(c for c in report["cases"] if c["name"] == case and c["phase"] == "step")
    assert step["table"] == "bf16_training"
    # the float32 copies the optimizers step: the Trainer's master weights, Megatron's main params
    assert {(r["dtype"], r["candidate_dtype"]) for r in step["records"]} == {("float32", "float32")}
