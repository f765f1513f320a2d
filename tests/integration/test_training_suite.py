"""example_suites/training end to end through the plugin: the tool's loop vs a real
transformers.Trainer over 10 steps (and 6 steps of file rows), every phase aligned."""

from __future__ import annotations

import json

import pytest

from tests.helpers.runs import ExampleSuite, RunPytest


@pytest.mark.slow  # 4 Trainer/loop runs of 10 and 6 steps; tests/run/test_hf_trainer.py is the fast one
def test_training_suite_aligns_every_phase(
    pytester: pytest.Pytester, example_suite: ExampleSuite, run_pytest: RunPytest
) -> None:
    folder = example_suite("training")
    result = run_pytest(  # the Megatron cases are tests/integration/test_training_suite_megatron.py's
        "--align-config",
        str(folder / "align.yaml"),
        str(folder),
        "--align-report",
        "out",
        "-k",
        "loop_vs_hf_trainer",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 6, result.stdout.str()
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert {(c["name"], c["phase"]) for c in report["cases"] if c["passed"]} == {
        (name, phase)
        for name in ("loop_vs_hf_trainer", "dataset_loop_vs_hf_trainer")
        for phase in ("forward", "backward", "step")
    }
